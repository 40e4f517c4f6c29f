//! Job secrets end to end: switchd refuses a weak secret from `switchctl
//! job add`, whichever way switchctl was given it; switchctl takes a secret
//! from a file or the environment silently and warns about one on its
//! command line; `switchd check-config` warns about a config that others can
//! read. Testbed `op4` (2 workers). Needs root; under `CI=true` it fails
//! rather than skips when something is missing.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use agg_e2e::*;

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `switchctl job add --id ID …` against `sw`, with `secret_args` and an
/// optional AGGSWITCH_SECRET.
fn add_job(tb: &Testbed, sw: &Switchd, id: u16, secret_args: &[&str], env: Option<&str>) -> Output {
    let mut c = Command::new(switchctl_bin());
    c.arg("--socket").arg(&sw.admin);
    c.args(["job", "add", "--id", &id.to_string(), "--workers", "2"]);
    c.args(["--allow", &tb.subnet().to_string(), "--slots", "16"]);
    c.args(secret_args);
    c.env_remove("AGGSWITCH_SECRET");
    if let Some(v) = env {
        c.env("AGGSWITCH_SECRET", v);
    }
    c.output().expect("running switchctl")
}

fn write_mode(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[test]
#[ignore = "needs root"]
fn weak_secrets_are_refused_and_secrets_stay_off_the_command_line() {
    if !can_run("secrets") {
        return;
    }
    let tb = Testbed::up("op4", 2, 0);
    let mut sw = Switchd::start(&tb, &[JobSpec::new(1, 2)]);
    let dir = sw.dir.clone();

    // A weak secret, from a 0600 file or the environment: refused by
    // switchd, naming the job and how to make a good one.
    let weak = dir.join("weak.key");
    write_mode(&weak, &format!("{}\n", "00".repeat(32)), 0o600);
    for out in [
        add_job(
            &tb,
            &sw,
            2,
            &["--secret-file", weak.to_str().unwrap()],
            None,
        ),
        add_job(&tb, &sw, 2, &[], Some(&"ab".repeat(32))),
    ] {
        assert!(!out.status.success(), "{}", text(&out));
        let t = text(&out);
        assert!(
            t.contains("job 2: secret is weak") && t.contains("openssl rand -hex 32"),
            "{t}"
        );
    }
    let ids = |sw: &Switchd| -> Vec<u64> {
        let out = sw.switchctl(&["--json", "jobs"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("switchctl --json jobs: {e}: {}", text(&out)));
        v.as_array()
            .unwrap()
            .iter()
            .map(|j| j["id"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(ids(&sw), vec![1], "no weak job was added");

    // A good secret from the environment: added, no warning.
    let out = add_job(&tb, &sw, 3, &[], Some(SECRET));
    assert!(out.status.success(), "{}", text(&out));
    assert!(out.stderr.is_empty(), "{}", text(&out));
    // From a file others can read: added, with the chmod to run.
    let open = dir.join("open.key");
    write_mode(&open, SECRET, 0o644);
    let out = add_job(
        &tb,
        &sw,
        4,
        &["--secret-file", open.to_str().unwrap()],
        None,
    );
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("chmod 600 {}", open.display())),
        "{}",
        text(&out)
    );
    // On the command line: added, with the warning and the alternatives.
    let out = add_job(&tb, &sw, 5, &["--secret", SECRET], None);
    assert!(out.status.success(), "{}", text(&out));
    let t = text(&out);
    assert!(
        t.contains("/proc/PID/cmdline")
            && t.contains("--secret-file")
            && t.contains("AGGSWITCH_SECRET"),
        "{t}"
    );
    assert_eq!(ids(&sw), vec![1, 3, 4, 5]);
    // Two sources, or a file that is not there: refused before switchd is
    // asked, saying which.
    let out = add_job(&tb, &sw, 6, &["--secret", SECRET], Some(SECRET));
    assert!(!out.status.success());
    assert!(text(&out).contains("given twice"), "{}", text(&out));
    let out = add_job(
        &tb,
        &sw,
        6,
        &["--secret-file", "/nonexistent/op4.key"],
        None,
    );
    assert!(!out.status.success());
    assert!(
        text(&out).contains("/nonexistent/op4.key") && text(&out).contains("os error 2"),
        "{}",
        text(&out)
    );

    // The test harness writes its configs 0600: no warning at start.
    assert!(
        !sw.log_text().contains("readable by group or others"),
        "{}",
        sw.log_text()
    );
    // check-config on a copy others can read warns with the fix.
    let cfg = std::fs::read_to_string(sw.dir.join("switchd.toml")).unwrap();
    let open_cfg = dir.join("open.toml");
    write_mode(&open_cfg, &cfg, 0o644);
    let out = Command::new(switchd_bin())
        .args(["check-config", "--config"])
        .arg(&open_cfg)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("chmod 600 {}", open_cfg.display())),
        "{}",
        text(&out)
    );
    // And a weak secret in a config is refused by check-config.
    let weak_cfg = dir.join("weak.toml");
    write_mode(&weak_cfg, &cfg.replace(SECRET, &"11".repeat(32)), 0o600);
    let out = Command::new(switchd_bin())
        .args(["check-config", "--config"])
        .arg(&weak_cfg)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains("job 1: secret is weak"),
        "{}",
        text(&out)
    );
    stop_clean(&tb, &mut sw);
}
