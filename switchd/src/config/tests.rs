//! The configuration's checks: what loads, what each check refuses and
//! how it says so, the defaults, and the layout warnings.

use std::path::{Path, PathBuf};

use proto::switch::Priority;
use proto::tag::AuthMode;
use proto::wire::{elems_per_chunk_for_mtu, Dtype};

use super::*;

const GOOD: &str = r#"
[switch]
ports = ["sw-w0", "sw-w1"]
addresses = ["198.18.0.1"]

[[job]]
id = 1
n_workers = 2
allowed_sources = ["198.18.0.0/24"]
secret = "0000000000000000000000000000000000000000000000000000000000000001"
"#;

fn parse(t: &str) -> Result<Config, ConfigError> {
    Config::parse(t, Path::new("test.toml"), |_| Some(1500))
}

#[test]
fn defaults_fill_in() {
    let c = parse(GOOD).unwrap();
    assert_eq!(c.switch.agg_port, 48879);
    // (1500 - 50) / 4 floats less the RESULT's token (4 floats' room).
    assert_eq!(c.jobs[0].elems_per_chunk, 358);
    assert_eq!(c.jobs[0].pool_slots, 256);
    assert_eq!(c.jobs[0].window, 256);
    assert_eq!(c.jobs[0].secret[31], 1);
}

#[test]
fn errors_name_line_and_key() {
    let e = parse(&GOOD.replace("n_workers = 2", "n_workers = \"two\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 8") && e.contains("n_workers"), "{e}");
    let e = parse(&GOOD.replace("ports =", "portz ="))
        .unwrap_err()
        .to_string();
    assert!(e.contains("portz"), "{e}");
    let e = parse(&GOOD.replace("secret = \"00", "secret = \"zz"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("job 1") && e.contains("hex"), "{e}");
    let e = parse(&format!("{GOOD}pool_slots = 100\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("power of two"), "{e}");
    let e = parse(&GOOD.replace(
        "allowed_sources = [\"198.18.0.0/24\"]",
        "allowed_sources = [\"198.18.0.0/33\"]",
    ))
    .unwrap_err()
    .to_string();
    assert!(e.contains("allowed_sources"), "{e}");
}

#[test]
fn weak_secrets_are_refused_naming_the_job_and_how_to_make_one() {
    for weak in ["00".repeat(32), "ab".repeat(32), "FF".repeat(32)] {
        let e = parse(&GOOD.replace(
            "0000000000000000000000000000000000000000000000000000000000000001",
            &weak,
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("job 1") && e.contains("weak"), "{e}");
        assert!(
            e.contains("openssl rand -hex 32") && e.contains("head -c32 /dev/urandom"),
            "{e}"
        );
    }
    // The admin path (switchctl job add) goes through the same check.
    let mut j = JobSection {
        id: 7,
        n_workers: 2,
        allowed_sources: vec!["198.18.0.0/24".parse().unwrap()],
        secret: "00".repeat(32),
        pool_slots: 16,
        elems_per_chunk: None,
        window: None,
        dtype: None,
        upstream: None,
        auth: None,
        stats: false,
        priority: None,
    };
    let e = j.to_job_config(362, 362, None).unwrap_err();
    assert!(e.contains("job 7") && e.contains("weak"), "{e}");
    j.secret = format!("{}01", "00".repeat(31));
    assert!(j.to_job_config(362, 362, None).is_ok());
}

#[test]
fn a_config_with_secrets_that_others_can_read_gets_a_chmod_warning() {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("switchd-cfg-{}.toml", std::process::id()));
    std::fs::write(&path, GOOD).unwrap();
    let check = |mode: u32| {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        let cfg = Config::parse(GOOD, &path, |_| Some(1500)).unwrap();
        let no_jobs = Config {
            jobs: Vec::new(),
            ..cfg.clone()
        };
        (
            secrets_exposure(&path, &cfg),
            secrets_exposure(&path, &no_jobs),
        )
    };
    let (open, no_jobs) = check(0o644);
    let (group, _) = check(0o640);
    let (private, _) = check(0o600);
    std::fs::remove_file(&path).unwrap();
    let w = open.expect("0644 with secrets warns");
    assert!(
        w.contains(&format!("chmod 600 {}", path.display())) && w.contains("0644"),
        "{w}"
    );
    assert!(group.is_some(), "group-readable warns");
    assert_eq!(private, None);
    assert_eq!(no_jobs, None, "a file without jobs holds no secret");
}

#[test]
fn watchdog_defaults_to_5_s_takes_0_for_off_and_refuses_negatives() {
    assert_eq!(parse(GOOD).unwrap().switch.watchdog_secs, 5.0);
    let with =
        |v: &str| parse(&GOOD.replace("[switch]\n", &format!("[switch]\nwatchdog_secs = {v}\n")));
    assert_eq!(with("0").unwrap().switch.watchdog_secs, 0.0);
    assert_eq!(with("2.5").unwrap().switch.watchdog_secs, 2.5);
    let e = with("-1").unwrap_err().to_string();
    assert!(e.contains("watchdog_secs"), "{e}");
}

#[test]
fn umem_huge_pages_defaults_to_auto_and_takes_on_and_off() {
    assert_eq!(
        parse(GOOD).unwrap().switch.umem_huge_pages,
        UmemHugePages::Auto
    );
    for (v, want) in [("on", UmemHugePages::On), ("off", UmemHugePages::Off)] {
        let c = parse(&with_switch(&format!("umem_huge_pages = \"{v}\"\n"))).unwrap();
        assert_eq!(c.switch.umem_huge_pages, want);
    }
    let e = parse(&with_switch("umem_huge_pages = \"yes\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("umem_huge_pages") || e.contains("yes"), "{e}");
}

/// GOOD with `extra` lines at the top of `[switch]`.
fn with_switch(extra: &str) -> String {
    GOOD.replace("[switch]\n", &format!("[switch]\n{extra}\n"))
}

#[test]
fn metrics_listen_defaults_to_loopback_and_off_turns_it_off() {
    let sw = parse(GOOD).unwrap().switch;
    assert_eq!(sw.metrics_listen, MetricsListen::Default);
    assert_eq!(
        sw.metrics_listen.addr(),
        Some("127.0.0.1:9100".parse().unwrap())
    );
    assert!(sw.metrics_per_job && !sw.metrics_on_data_network);
    assert_eq!(sw.check_metrics_exposure(&[]), Ok(None));
    let off = parse(&with_switch("metrics_listen = \"off\"")).unwrap();
    assert_eq!(off.switch.metrics_listen, MetricsListen::Off);
    assert_eq!(off.switch.metrics_listen.addr(), None);
    for (text, addr) in [
        ("127.0.0.1:9200", "127.0.0.1:9200"),
        ("[::1]:9100", "[::1]:9100"),
    ] {
        let c = parse(&with_switch(&format!("metrics_listen = \"{text}\""))).unwrap();
        assert_eq!(
            c.switch.metrics_listen,
            MetricsListen::At(addr.parse().unwrap())
        );
    }
    for bad in ["\"localhost:9100\"", "\"Off\"", "\"127.0.0.1\"", "9100"] {
        let e = parse(&with_switch(&format!("metrics_listen = {bad}")))
            .unwrap_err()
            .to_string();
        assert!(e.contains("metrics_listen"), "{bad}: {e}");
    }
    let e = parse(&with_switch("metrics_listen = \"localhost:9100\""))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"ADDR:PORT\"") && e.contains("or \"off\""),
        "{e}"
    );
}

#[test]
fn metrics_on_the_data_network_is_refused_naming_the_address_why_and_the_fix() {
    let leaf = "uplink = \"198.19.0.2:40000\"";
    for (listen, why) in [
        (
            "0.0.0.0:9100",
            "is the unspecified address, which listens on every interface",
        ),
        ("[::]:9100", "is the unspecified address"),
        (
            "198.18.0.1:9100",
            "is one of the switch's own aggregation addresses (switch.addresses)",
        ),
        ("198.19.0.2:9100", "is the address of switch.uplink"),
    ] {
        let text = with_switch(&format!("{leaf}\nmetrics_listen = \"{listen}\""));
        let e = parse(&text).unwrap_err().to_string();
        assert!(
            e.starts_with("config test.toml: ")
                && e.contains(&format!("switch.metrics_listen = \"{listen}\" {why}"))
                && e.contains("read every job's progress")
                && e.contains("leave metrics_listen out for 127.0.0.1:9100")
                && e.contains("set metrics_on_data_network = true"),
            "{listen}: {e}"
        );
        // The operator's override: loaded, with a warning to log.
        let c = parse(&text.replace("[switch]\n", "[switch]\nmetrics_on_data_network = true\n"))
            .unwrap();
        let w = c.switch.check_metrics_exposure(&[]).unwrap().unwrap();
        assert!(
            w.contains(&format!("\"{listen}\" {why}"))
                && w.contains("metrics_on_data_network = true")
                && w.contains("set metrics_per_job = false"),
            "{w}"
        );
    }
    // A management address is not refused.
    assert!(parse(&with_switch("metrics_listen = \"10.9.8.7:9100\"")).is_ok());
    // An address the machine has on a port's bridge, found at start.
    let c = parse(&with_switch("metrics_listen = \"10.9.8.7:9100\"")).unwrap();
    let br = crate::exposure::InterfaceAddr {
        ifname: "br0".into(),
        port: "sw-w1".into(),
        addr: "10.9.8.7".parse().unwrap(),
    };
    let e = c.switch.check_metrics_exposure(&[br]).unwrap_err();
    assert!(
        e.contains("\"10.9.8.7:9100\" is an address of br0, the bridge of port sw-w1"),
        "{e}"
    );
}

#[test]
fn metrics_per_job_defaults_to_true_and_the_metrics_keys_round_trip() {
    assert!(parse(GOOD).unwrap().switch.metrics_per_job);
    let c = parse(&with_switch("metrics_per_job = false")).unwrap();
    assert!(!c.switch.metrics_per_job);
    // Written back (switchd testbed-config, the e2e configs): defaults
    // left out, the rest as read.
    let file = |extra: &str| toml::from_str::<ConfigFile>(&with_switch(extra)).unwrap();
    let out = |extra: &str| toml::to_string(&file(extra)).unwrap();
    let plain = out("");
    assert!(!plain.contains("metrics"), "{plain}");
    let set = "metrics_listen = \"off\"\nmetrics_per_job = false\nmetrics_on_data_network = true";
    let text = out(set);
    for line in set.lines() {
        assert!(text.contains(line), "{line} not in:\n{text}");
    }
    let back: ConfigFile = toml::from_str(&text).unwrap();
    assert_eq!(back.switch.metrics_listen, MetricsListen::Off);
    let at = out("metrics_listen = \"[::1]:9100\"");
    assert!(at.contains("metrics_listen = \"[::1]:9100\""), "{at}");
}

#[test]
fn forwarding_defaults_to_xdp_and_can_be_turned_off() {
    assert_eq!(
        parse(GOOD).unwrap().switch.forwarding,
        ForwardingSetting::Xdp
    );
    let c = parse(&GOOD.replace("[switch]\n", "[switch]\nforwarding = \"bridge\"\n")).unwrap();
    assert_eq!(c.switch.forwarding, ForwardingSetting::Bridge);
    let e = parse(&GOOD.replace("[switch]\n", "[switch]\nforwarding = \"fast\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("forwarding"), "{e}");
    let c = parse(&GOOD.replace("[switch]\n", "[switch]\nmode = \"xdp-drop\"\n")).unwrap();
    assert_eq!(c.switch.mode, DataplaneMode::XdpDrop);
}

#[test]
fn mtu_sets_chunk_size_and_frames_cap_it() {
    // A frame's floats less the RESULT's token (16 bytes).
    let c = Config::parse(GOOD, Path::new("t"), |_| Some(3500)).unwrap();
    assert_eq!(c.jobs[0].elems_per_chunk, elems_per_chunk_for_mtu(3500) - 4);
    assert!(!c.multi_buffer);
    let c = Config::parse(GOOD, Path::new("t"), |_| Some(3826)).unwrap();
    assert!(c.multi_buffer, "above one page needs multi-buffer");
    assert_eq!(c.jobs[0].elems_per_chunk, elems_per_chunk_for_mtu(3826) - 4);
    let c = Config::parse(GOOD, Path::new("t"), |p| {
        Some(if p == "sw-w1" { 1000 } else { 1500 })
    })
    .unwrap();
    assert_eq!(c.jobs[0].elems_per_chunk, elems_per_chunk_for_mtu(1000) - 4);
}

#[test]
fn jumbo_mtu_grants_the_9000_byte_chunk_and_refuses_larger_mtus() {
    let c = Config::parse(GOOD, Path::new("t"), |_| Some(9000)).unwrap();
    assert!(c.multi_buffer);
    // 2237 floats less the RESULT's token.
    assert_eq!(c.jobs[0].elems_per_chunk, 2233);
    let e = Config::parse(GOOD, Path::new("t"), |p| {
        Some(if p == "sw-w1" { 9216 } else { 9000 })
    })
    .unwrap_err()
    .to_string();
    assert!(e.contains("sw-w1 has MTU 9216"), "{e}");
    assert!(e.contains("ip link set sw-w1 mtu 9000"), "{e}");
    // Without multi-buffer a chunk must fit one frame.
    let big = GOOD.replace("[[job]]\n", "[[job]]\nelems_per_chunk = 2000\n");
    assert!(Config::parse(&big, Path::new("t"), |_| Some(1500)).is_err());
    let c = Config::parse(&big, Path::new("t"), |_| Some(9000)).unwrap();
    assert_eq!(c.jobs[0].elems_per_chunk, 2000);
}

#[test]
fn priority_defaults_to_normal_and_a_typo_names_the_job_and_the_classes() {
    assert_eq!(parse(GOOD).unwrap().jobs[0].priority, Priority::Normal);
    let c = parse(&format!("{GOOD}priority = \"high\"\n")).unwrap();
    assert_eq!(c.jobs[0].priority, Priority::High);
    let e = parse(&format!("{GOOD}priority = \"urgent\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("job 1: priority \"urgent\"")
            && e.contains("\"low\", \"normal\" (the default), \"high\""),
        "{e}"
    );
    // A number is not a class: serde names the key and the type.
    let e = parse(&format!("{GOOD}priority = 3\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("priority"), "{e}");
}

#[test]
fn auth_mac_leaves_room_for_the_tag_and_a_wrong_value_names_the_choices() {
    assert_eq!(parse(GOOD).unwrap().jobs[0].auth, AuthMode::Port);
    let mac = format!("{GOOD}auth = \"mac\"\n");
    let c = parse(&mac).unwrap();
    assert_eq!(c.jobs[0].auth, AuthMode::Mac);
    // 16 bytes less payload: 362 - 4 floats at MTU 1500, 724 - 8 bf16.
    assert_eq!(c.jobs[0].elems_per_chunk, 358);
    let c = parse(&format!("{mac}dtype = \"bf16\"\n")).unwrap();
    assert_eq!(c.jobs[0].elems_per_chunk, 716);
    // A tagged RESULT is sent from one frame, jumbo ports or not.
    let c = Config::parse(&mac, Path::new("t"), |_| Some(9000)).unwrap();
    assert_eq!(c.jobs[0].elems_per_chunk, MAX_ELEMS_IN_FRAME - 4);
    let e = parse(&format!("{mac}elems_per_chunk = 941\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("elems_per_chunk must be 1..=940"), "{e}");
    let e = parse(&format!("{GOOD}auth = \"hmac\"\n"))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("job 1: auth") && e.contains("\"port\" or \"mac\""),
        "{e}"
    );
    let leaf = GOOD.replace("[switch]\n", "[switch]\nuplink = \"198.19.0.2:48880\"\n");
    let leaf = format!(
        "{leaf}auth = \"mac\"\n[job.upstream]\nleaf_index = 0\nn_leaves = 2\n\
         spines = [\"198.19.0.1:48879\"]\n"
    );
    let e = parse(&leaf).unwrap_err().to_string();
    assert!(e.contains("not supported on a leaf"), "{e}");
}

#[test]
fn stats_leaves_room_for_the_trailer_and_is_off_by_default() {
    assert!(!parse(GOOD).unwrap().jobs[0].stats);
    let st = format!("{GOOD}stats = true\n");
    let c = parse(&st).unwrap();
    assert!(c.jobs[0].stats);
    // 24 bytes less payload, and the RESULT's 16-byte token or tag
    // (either auth mode): 362 - 10 floats at MTU 1500, 724 - 20 bf16.
    assert_eq!(c.jobs[0].elems_per_chunk, 352);
    let c = parse(&format!("{st}dtype = \"bf16\"\n")).unwrap();
    assert_eq!(c.jobs[0].elems_per_chunk, 704);
    let c = parse(&format!("{st}auth = \"mac\"\n")).unwrap();
    assert_eq!(c.jobs[0].elems_per_chunk, 352);
    // The limit (a frame's floats, 944) leaves room for them too.
    let e = parse(&format!("{st}elems_per_chunk = 935\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("elems_per_chunk must be 1..=934"), "{e}");
    // switchctl's section says it only when on (older switchds refuse
    // unknown keys).
    let mut j = toml::from_str::<ConfigFile>(&st).unwrap().jobs[0].clone();
    assert!(serde_json::to_string(&j)
        .unwrap()
        .contains("\"stats\":true"));
    j.stats = false;
    assert!(!serde_json::to_string(&j).unwrap().contains("stats"));
}

#[test]
fn dtype_is_declared_with_the_job_and_doubles_the_chunk() {
    assert_eq!(parse(GOOD).unwrap().jobs[0].dtype, Dtype::F32);
    for (name, dtype) in [("bf16", Dtype::Bf16), ("f16", Dtype::F16)] {
        let c = parse(&format!("{GOOD}dtype = \"{name}\"\n")).unwrap();
        assert_eq!(c.jobs[0].dtype, dtype);
        assert_eq!(
            c.jobs[0].elems_per_chunk, 716,
            "twice the f32 chunk at MTU 1500 (the token's room less)"
        );
        // So does the jumbo chunk (multi-buffer sockets).
        let c = Config::parse(
            &format!("{GOOD}dtype = \"{name}\"\n"),
            Path::new("t"),
            |_| Some(9000),
        )
        .unwrap();
        assert_eq!(c.jobs[0].elems_per_chunk, 2 * 2233);
    }
    // A leaf's partials go up as float32: its default chunk is float32's.
    let leaf = GOOD.replace("[switch]\n", "[switch]\nuplink = \"198.19.0.2:48880\"\n");
    let leaf = format!(
        "{leaf}dtype = \"bf16\"\n[job.upstream]\nleaf_index = 0\nn_leaves = 2\n\
         spines = [\"198.19.0.1:48879\"]\n"
    );
    let c = parse(&leaf).unwrap();
    assert_eq!(
        (c.jobs[0].dtype, c.jobs[0].elems_per_chunk),
        (Dtype::Bf16, 358)
    );
    let e = parse(&format!("{GOOD}dtype = \"fp8\"\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("job 1") && e.contains("f32, bf16 or f16"), "{e}");
    // A frame's 944 floats, as bf16, less the RESULT's token (8 elements).
    let e = parse(&format!("{GOOD}dtype = \"bf16\"\nelems_per_chunk = 2000\n"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("elems_per_chunk must be 1..=1880"), "{e}");
}

#[test]
fn seq_lanes_are_a_power_of_two_within_the_ports() {
    let with = |extra: &str| GOOD.replace("[switch]\n", &format!("[switch]\n{extra}\n"));
    assert_eq!(parse(GOOD).unwrap().switch.seq_lanes, 1);
    assert_eq!(parse(&with("seq_lanes = 4")).unwrap().switch.seq_lanes, 4);
    for bad in ["seq_lanes = 3", "seq_lanes = 0", "seq_lanes = 128"] {
        let e = parse(&with(bad)).unwrap_err().to_string();
        assert!(
            e.contains("switch.seq_lanes must be a power of two in 1..=64"),
            "{bad}: {e}"
        );
    }
    let e = parse(&with("agg_port = 65534\nseq_lanes = 4"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("runs past UDP port 65535"), "{e}");
}

#[test]
fn lanes_that_are_not_a_multiple_of_the_threads_get_a_warning() {
    assert_eq!(lane_warnings(1, 1, 4), vec![]);
    assert_eq!(lane_warnings(4, 4, 4), vec![]);
    assert_eq!(
        lane_warnings(4, 4, 2),
        vec![],
        "thread t serves queues t, t + 2"
    );
    // More lanes than threads or queues: a placement, lane l on queue
    // l mod queues (what multi-thread workers need).
    for (lanes, queues, threads) in [(8, 4, 4), (4, 2, 2), (8, 1, 1), (64, 2, 1), (4, 4, 1)] {
        assert_eq!(
            lane_warnings(lanes, queues, threads),
            vec![],
            "{lanes} {queues} {threads}"
        );
    }
    // Not a multiple of the threads, or threads over the queues.
    for (lanes, queues, threads) in [(2, 4, 4), (2, 2, 4), (4, 3, 3), (4, 2, 4)] {
        let w = lane_warnings(lanes, queues, threads);
        assert_eq!(w.len(), 1, "{lanes} {queues} {threads}");
        let msg = w[0].to_string();
        assert!(
            msg.contains(&format!("seq_lanes = {lanes}"))
                && msg.contains("set seq_lanes to a multiple of dataplane_threads"),
            "{msg}"
        );
    }
}

#[test]
fn threads_beyond_the_cpus_get_a_warning_that_names_both_and_the_fix() {
    assert_eq!(layout_warnings(Some(4), 2, 2, 4), vec![]);
    let w = layout_warnings(Some(2), 4, 1, 4);
    assert_eq!(
        w,
        vec![LayoutWarning::ThreadsOverCores {
            threads: 4,
            cores: 2
        }]
    );
    let msg = w[0].to_string();
    assert!(
        msg.contains("dataplane_threads = 4") && msg.contains("set dataplane_threads to 2"),
        "{msg}"
    );
    // CPUs unknown: nothing to compare.
    assert_eq!(layout_warnings(None, 4, 1, 4), vec![]);
}

#[test]
fn sockets_that_do_not_divide_among_the_threads_get_a_warning_with_even_choices() {
    // 3 ports × 1 queue over 2 threads: one thread serves 2, one 1.
    let w = layout_warnings(Some(16), 3, 1, 2);
    assert_eq!(
        w,
        vec![LayoutWarning::UnevenSockets {
            ports: 3,
            queues: 1,
            threads: 2
        }]
    );
    let msg = w[0].to_string();
    assert!(
        msg.contains("3 AF_XDP sockets (3 ports × 1 queues)")
            && msg.contains("1 of them serve 2 sockets and 1 serve 1")
            && msg.contains("dataplane_threads = 1")
            && msg.contains("queues = 2"),
        "{msg}"
    );
    // 2 ports × 3 queues over 4 threads: 3 threads would divide the 6
    // sockets, and 4 queues make 8, the next multiple of 4.
    let msg = layout_warnings(Some(16), 2, 3, 4)[0].to_string();
    assert!(
        msg.contains("2 of them serve 2 sockets and 2 serve 1")
            && msg.contains("dataplane_threads = 3")
            && msg.contains("queues = 4"),
        "{msg}"
    );
    // Even deals, one socket per thread or several: no warning.
    for (ports, queues, threads) in [(1, 4, 4), (4, 1, 2), (2, 2, 4), (3, 2, 3), (5, 1, 1)] {
        assert_eq!(
            layout_warnings(Some(16), ports, queues, threads),
            vec![],
            "{ports} ports × {queues} queues over {threads} threads"
        );
    }
    // Both at once.
    assert_eq!(layout_warnings(Some(2), 3, 1, 3).len(), 1);
    assert_eq!(layout_warnings(Some(2), 5, 1, 3).len(), 2);
}

#[test]
fn queues_that_differ_from_the_nics_get_a_warning_naming_the_port_and_ethtool() {
    let ports = vec!["ens1f0".to_string(), "ens1f1".to_string(), "veth9".into()];
    let nic = |p: &str| match p {
        "ens1f0" => Some(8),
        "ens1f1" => Some(2),
        _ => None,
    };
    let w = nic_queue_warnings(&ports, 4, nic);
    assert_eq!(
        w,
        vec![
            LayoutWarning::QueuesUnderNic {
                port: "ens1f0".into(),
                queues: 4,
                nic: 8
            },
            LayoutWarning::QueuesOverNic {
                port: "ens1f1".into(),
                queues: 4,
                nic: 2
            },
        ]
    );
    let under = w[0].to_string();
    assert!(
        under.contains("queues 4..7")
            && under.contains("never aggregated")
            && under.contains("ethtool -L ens1f0 combined 4"),
        "{under}"
    );
    let over = w[1].to_string();
    assert!(
        over.contains("socket for queues 2..3 cannot bind")
            && over.contains("ethtool -L ens1f1 combined 4"),
        "{over}"
    );
    assert_eq!(nic_queue_warnings(&ports, 8, |_| Some(8)), vec![]);
}

#[test]
fn rx_queues_are_counted_from_sysfs_and_unknown_for_a_missing_port() {
    // Loopback exists in every namespace and has one receive queue.
    assert_eq!(sysfs_rx_queues("lo"), Some(1));
    assert_eq!(sysfs_rx_queues("no-such-if0"), None);
}

#[test]
fn the_admin_socket_is_found_in_a_config_file_or_defaulted() {
    let dir = std::env::temp_dir().join(format!("switchd-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let named = dir.join("named.toml");
    std::fs::write(
        &named,
        "[switch]\nports = [\"a\"]\nadmin_socket = \"/tmp/x.sock\"\n",
    )
    .unwrap();
    assert_eq!(
        admin_socket_in(&named).unwrap(),
        PathBuf::from("/tmp/x.sock")
    );
    let plain = dir.join("plain.toml");
    std::fs::write(&plain, "[switch]\nports = [\"a\"]\n").unwrap();
    assert_eq!(
        admin_socket_in(&plain).unwrap(),
        PathBuf::from(DEFAULT_ADMIN_SOCKET)
    );
    let e = admin_socket_in(&dir.join("missing.toml")).unwrap_err();
    assert!(e.to_string().contains("missing.toml"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}
