//! The `[[tenant]]` checks: a config of tenants and no jobs, the defaults
//! of docs/PROTOCOL.md's table, every refusal's message (each names the
//! tenant and the key), key files (weak keys, loose modes, relative
//! paths) and the job id ranges.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use proto::switch::Priority;
use proto::tag::AuthMode;
use proto::wire::Dtype;

use super::*;

const KEY: &str = "3c5e7a9b1d2f40618293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";

const SWITCH: &str = r#"
[switch]
ports = ["sw-w0", "sw-w1"]
addresses = ["198.18.0.1"]
"#;

/// A directory of its own with `a.key` and `b.key` (mode 0600) in it.
struct Dir(PathBuf);

impl Dir {
    fn new(tag: &str) -> Dir {
        let d = std::env::temp_dir().join(format!(
            "switchd-tenants-{tag}-{}-{:x}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&d).unwrap();
        let dir = Dir(d);
        dir.key("a.key", KEY, 0o600);
        dir.key("b.key", &KEY.replace("3c", "4d"), 0o600);
        dir
    }

    fn key(&self, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, format!("{text}\n")).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    fn parse(&self, text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, &self.0.join("switch.toml"), |_| Some(1500))
    }

    fn refusal(&self, text: &str) -> String {
        match self.parse(text) {
            Ok(_) => panic!("accepted:\n{text}"),
            Err(e) => e.to_string(),
        }
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tenant(name: &str, key: &str, extra: &str) -> String {
    format!(
        "\n[[tenant]]\nname = \"{name}\"\nkey_file = \"{key}\"\n\
         allowed_sources = [\"198.18.0.0/24\"]\n{extra}\n"
    )
}

#[test]
fn tenants_and_no_jobs_make_a_whole_config_with_the_documented_defaults() {
    let dir = Dir::new("defaults");
    // A relative key_file is taken from the config file's directory.
    let c = dir
        .parse(&format!("{SWITCH}{}", tenant("team-a", "a.key", "")))
        .unwrap();
    assert!(c.jobs.is_empty());
    assert!(c.key_warnings.is_empty(), "{:?}", c.key_warnings);
    let t = &c.tenants[0];
    assert_eq!(t.name.as_str(), "team-a");
    assert_eq!(hex::encode(t.key), KEY);
    assert_eq!(
        (t.max_jobs, t.max_workers_per_job, t.max_pool_bytes),
        (4, 256, 1 << 30)
    );
    assert_eq!(t.dtypes, [Dtype::F32, Dtype::Bf16, Dtype::F16]);
    assert_eq!(t.auth, [AuthMode::Port, AuthMode::Mac]);
    assert_eq!(t.max_priority, Priority::Normal);
    assert_eq!(t.job_ids, (32768, 65535));
    assert_eq!(t.lease, Duration::from_secs(60));
    assert_eq!(t.pool_slots, 256);
    assert!(t.upstream.is_none());
    assert_eq!(t.allowed_sources.len(), 1);

    // Every key set, an absolute key_file, a leaf's upstream.
    let abs = dir.0.join("b.key");
    let c = dir
        .parse(&format!(
            "{SWITCH}uplink = \"198.18.0.1:40000\"\n{}",
            tenant(
                "b",
                abs.to_str().unwrap(),
                "max_jobs = 2\nmax_workers_per_job = 8\nmax_pool_bytes = 1048576\n\
                 dtypes = [\"bf16\"]\nauth = [\"mac\"]\nmax_priority = \"high\"\n\
                 job_ids = [100, 199]\nlease_secs = 600\npool_slots = 64\n\
                 [tenant.upstream]\nleaf_index = 1\nn_leaves = 2\n\
                 spines = [\"198.19.255.1:48879\"]"
            )
        ))
        .unwrap();
    let t = &c.tenants[0];
    assert_eq!(
        (t.max_jobs, t.max_workers_per_job, t.max_pool_bytes),
        (2, 8, 1 << 20)
    );
    assert_eq!(
        (t.dtypes.as_slice(), t.auth.as_slice()),
        (&[Dtype::Bf16][..], &[AuthMode::Mac][..])
    );
    assert_eq!(t.max_priority, Priority::High);
    assert_eq!(
        (t.job_ids, t.lease, t.pool_slots),
        ((100, 199), Duration::from_secs(600), 64)
    );
    let up = t.upstream.as_ref().unwrap();
    assert_eq!((up.leaf_index, up.n_leaves, up.local_port), (1, 2, 40000));
}

#[test]
fn the_default_range_goes_to_the_one_tenant_without_one_else_each_needs_its_own() {
    let dir = Dir::new("ranges");
    let c = dir
        .parse(&format!(
            "{SWITCH}{}{}",
            tenant("a", "a.key", "job_ids = [1000, 1999]"),
            tenant("b", "b.key", "")
        ))
        .unwrap();
    assert_eq!(c.tenants[0].job_ids, (1000, 1999));
    assert_eq!(c.tenants[1].job_ids, (32768, 65535));
    let e = dir.refusal(&format!(
        "{SWITCH}{}{}",
        tenant("a", "a.key", ""),
        tenant("b", "b.key", "")
    ));
    assert!(
        e.contains("tenant a: job_ids is missing")
            && e.contains("give each its own range, job_ids = [FIRST, LAST]"),
        "{e}"
    );
    // Ranges overlap: the message names both tenants and both ranges.
    let e = dir.refusal(&format!(
        "{SWITCH}{}{}",
        tenant("a", "a.key", "job_ids = [1000, 1999]"),
        tenant("b", "b.key", "job_ids = [1999, 2999]")
    ));
    assert!(
        e.contains("tenant b: job_ids [1999, 2999] overlap tenant a's")
            && e.contains("tenant a has [1000, 1999]")
            && e.contains("give each tenant its own range"),
        "{e}"
    );
    // A range that holds a declared job's id.
    let job = "\n[[job]]\nid = 40000\nn_workers = 2\nallowed_sources = [\"198.18.0.0/24\"]\n\
               secret = \"0000000000000000000000000000000000000000000000000000000000000001\"\n";
    let e = dir.refusal(&format!("{SWITCH}{job}{}", tenant("a", "a.key", "")));
    assert!(
        e.contains("tenant a: job_ids [32768, 65535] contain job 40000, a declared job")
            && e.contains("give the tenant a job_ids range without it"),
        "{e}"
    );
    // Declared jobs and a tenant beside them.
    let c = dir
        .parse(&format!(
            "{SWITCH}{}{}",
            job.replace("40000", "7"),
            tenant("a", "a.key", "")
        ))
        .unwrap();
    assert_eq!((c.jobs.len(), c.tenants.len()), (1, 1));
    let e = dir.refusal(&format!(
        "{SWITCH}{}{}",
        tenant("a", "a.key", "job_ids = [1, 9]"),
        tenant("a", "b.key", "job_ids = [10, 19]")
    ));
    assert!(e.contains("tenant a is already declared"), "{e}");
}

#[test]
fn every_bad_value_is_refused_naming_the_tenant_and_the_key() {
    let dir = Dir::new("refusals");
    let one = |extra: &str| dir.refusal(&format!("{SWITCH}{}", tenant("a", "a.key", extra)));
    for (extra, want) in [
        ("dtypes = [\"f64\"]", "tenant a: dtypes:"),
        ("dtypes = []", "tenant a: dtypes is empty"),
        ("auth = [\"none\"]", "tenant a: auth:"),
        ("auth = []", "tenant a: auth is empty"),
        ("max_priority = \"urgent\"", "tenant a: max_priority:"),
        ("max_jobs = 0", "tenant a: max_jobs must be at least 1"),
        (
            "max_workers_per_job = 0",
            "tenant a: max_workers_per_job must be at least 1",
        ),
        (
            "max_pool_bytes = 0",
            "tenant a: max_pool_bytes must be at least 1",
        ),
        (
            "lease_secs = 0",
            "tenant a: lease_secs must be 1..=86400, got 0",
        ),
        (
            "lease_secs = 86401",
            "lease_secs must be 1..=86400, got 86401",
        ),
        (
            "pool_slots = 100",
            "tenant a: pool_slots 100 must be a power of two",
        ),
        (
            "job_ids = [2000, 1999]",
            "tenant a: job_ids [2000, 1999] must be a range",
        ),
        (
            "job_ids = [0, 9]",
            "tenant a: job_ids [0, 9] must be a range",
        ),
        ("max_job = 2", "unknown field `max_job`"),
        (
            "[tenant.upstream]\nleaf_index = 0\nn_leaves = 2\nspines = [\"198.19.255.1:48879\"]",
            "tenant a: [tenant.upstream] needs [switch] uplink",
        ),
    ] {
        let e = one(extra);
        assert!(e.contains(want), "{extra}: {e}");
    }
    let e = dir.refusal(&format!(
        "{SWITCH}uplink = \"198.18.0.1:40000\"\n{}",
        tenant(
            "a",
            "a.key",
            "[tenant.upstream]\nleaf_index = 2\nn_leaves = 2\nspines = [\"198.19.255.1:48879\"]"
        )
    ));
    assert!(
        e.contains("tenant a: upstream: leaf_index must be below n_leaves"),
        "{e}"
    );
    let e = dir.refusal(&format!(
        "{SWITCH}{}",
        tenant("a", "a.key", "").replace("[\"198.18.0.0/24\"]", "[]")
    ));
    assert!(e.contains("tenant a: allowed_sources is empty"), "{e}");
    let e = dir.refusal(&format!("{SWITCH}{}", tenant("team a", "a.key", "")));
    assert!(
        e.contains("tenant: name: tenant name \"team a\" is not a valid name"),
        "{e}"
    );
}

#[test]
fn key_files_are_read_checked_and_warned_about() {
    let dir = Dir::new("keys");
    let cfg = |key: &str| format!("{SWITCH}{}", tenant("a", key, ""));
    // Missing: the path, the OS error, how to make one.
    let e = dir.refusal(&cfg("nope.key"));
    assert!(
        e.contains("tenant a: reading key_file")
            && e.contains("nope.key")
            && e.contains("openssl rand -hex 32 >"),
        "{e}"
    );
    // Weak, as job secrets are: every byte the same, or counting.
    let counting: String = (0u8..32).map(|b| format!("{b:02x}")).collect();
    let down: String = (0u8..32).rev().map(|b| format!("{b:02x}")).collect();
    for (text, why) in [
        ("00".repeat(32), "every byte is 0x00"),
        ("ab".repeat(32), "every byte is 0xab"),
        (counting, "its bytes count up from 0x00"),
        (down, "its bytes count down from 0x1f"),
    ] {
        dir.key("weak.key", &text, 0o600);
        let e = dir.refusal(&cfg("weak.key"));
        assert!(
            e.contains("tenant a: key_file")
                && e.contains("weak.key: tenant key is weak")
                && e.contains(why)
                && e.contains("openssl rand -hex 32"),
            "{e}"
        );
        assert!(!e.contains(&text), "the key is never printed: {e}");
    }
    dir.key("short.key", &KEY[..62], 0o600);
    let e = dir.refusal(&cfg("short.key"));
    assert!(
        e.contains("tenant key must be 32 bytes (64 hex digits), got 31 bytes"),
        "{e}"
    );
    dir.key("nothex.key", &KEY.replace('3', "x"), 0o600);
    let e = dir.refusal(&cfg("nothex.key"));
    assert!(e.contains("tenant key is not hex"), "{e}");
    // Loose modes load, with a warning naming the tenant and the file.
    for mode in [0o644, 0o640, 0o604] {
        dir.key("open.key", KEY, mode);
        let c = dir.parse(&cfg("open.key")).unwrap();
        let w = c.key_warnings.join("\n");
        assert!(
            w.contains("tenant a: tenant key file")
                && w.contains("open.key")
                && w.contains(&format!("mode {mode:04o}"))
                && w.contains("chmod 600"),
            "{mode:o}: {w}"
        );
    }
    // The admin path takes absolute paths only.
    let section = TenantSection {
        name: "a".into(),
        key_file: "a.key".into(),
        allowed_sources: vec!["198.18.0.0/24".parse().unwrap()],
        max_jobs: 1,
        max_workers_per_job: 1,
        max_pool_bytes: 1,
        dtypes: vec!["f32".into()],
        auth: vec!["port".into()],
        max_priority: "low".into(),
        job_ids: Some([5, 5]),
        lease_secs: 1,
        pool_slots: 1,
        upstream: None,
    };
    let e = section.to_tenant_config(None, None, None).unwrap_err();
    assert!(
        e.contains("tenant a: key_file a.key must be an absolute path"),
        "{e}"
    );
    let abs = TenantSection {
        key_file: dir.0.join("a.key"),
        ..section
    };
    let (t, warning) = abs.to_tenant_config(None, None, None).unwrap();
    assert!(warning.is_none());
    assert_eq!((t.job_ids, t.pool_slots), ((5, 5), 1));
}

#[test]
fn a_weak_job_secret_that_counts_is_refused_too() {
    let counting: String = (0x10u8..0x30).map(|b| format!("{b:02x}")).collect();
    let e = parse_secret(&counting).unwrap_err();
    assert!(
        e.contains("secret is weak (its bytes count up from 0x10)"),
        "{e}"
    );
    assert!(parse_secret(KEY).is_ok());
}
