//! `switchd check-config` as an operator runs it: layouts that run but
//! waste cores are accepted (exit 0) with a warning on stderr that says
//! what to change. Needs no root and no interfaces (ports that are not in
//! this namespace are not checked against their queues).

use std::process::Command;

fn check(switch_lines: &str) -> (bool, String, String) {
    let dir = std::env::temp_dir().join(format!(
        "switchd-check-config-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir(&dir).unwrap();
    let cfg = dir.join("switch.toml");
    std::fs::write(
        &cfg,
        format!("[switch]\naddresses = [\"198.18.0.1\"]\n{switch_lines}"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchd"))
        .args(["check-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn uneven_sockets_are_accepted_with_a_warning_naming_even_choices() {
    let (ok, out, err) =
        check("ports = [\"op1-a\", \"op1-b\", \"op1-c\"]\ndataplane_threads = 2\n");
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("3 ports × 1 queues = 3 AF_XDP sockets over 2 threads"),
        "{out}"
    );
    assert!(
        err.contains("warning: 3 AF_XDP sockets")
            && err.contains("set dataplane_threads = 1, or queues = 2"),
        "{err}"
    );
}

#[test]
fn more_threads_than_cpus_are_accepted_with_a_warning() {
    let cpus = std::thread::available_parallelism().unwrap().get();
    if cpus >= 64 {
        // 64 queues of one port is the most sockets a config may have.
        return;
    }
    let (ok, out, err) = check(&format!(
        "ports = [\"op1-a\"]\nqueues = 64\ndataplane_threads = {}\n",
        cpus + 1
    ));
    assert!(ok, "{out}{err}");
    assert!(
        err.contains(&format!("dataplane_threads = {}", cpus + 1))
            && err.contains(&format!("set dataplane_threads to {cpus} or fewer")),
        "{err}"
    );
}

#[test]
fn an_even_layout_within_the_cpus_gets_no_warning() {
    let (ok, out, err) = check("ports = [\"op1-a\", \"op1-b\"]\n");
    assert!(ok, "{out}{err}");
    assert!(!err.contains("warning"), "{err}");
}

/// A config of one tenant and no job (its key beside it, mode `mode`).
fn check_tenant(key: &str, mode: u32) -> (bool, String, String) {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!(
        "switchd-check-tenant-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir(&dir).unwrap();
    let key_file = dir.join("team-a.key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    std::fs::set_permissions(&key_file, std::fs::Permissions::from_mode(mode)).unwrap();
    let cfg = dir.join("switch.toml");
    std::fs::write(
        &cfg,
        "[switch]\nports = [\"op1-a\"]\naddresses = [\"198.18.0.1\"]\n\n[[tenant]]\n\
         name = \"team-a\"\nkey_file = \"team-a.key\"\nallowed_sources = [\"198.18.0.0/24\"]\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchd"))
        .args(["check-config", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_config_of_tenants_and_no_jobs_checks_and_a_weak_key_does_not() {
    let key = "3c5e7a9b1d2f40618293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f9";
    let (ok, out, err) = check_tenant(key, 0o600);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("tenant team-a: from 198.18.0.0/24, up to 4 jobs")
            && out.contains("job ids 32768-65535"),
        "{out}"
    );
    assert!(!err.contains("warning"), "{err}");
    let (ok, out, err) = check_tenant(key, 0o644);
    assert!(ok, "{out}{err}");
    assert!(
        err.contains("warning: tenant team-a: tenant key file") && err.contains("chmod 600"),
        "{err}"
    );
    let (ok, _, err) = check_tenant(&"00".repeat(32), 0o600);
    assert!(!ok);
    assert!(
        err.contains("tenant team-a") && err.contains("tenant key is weak"),
        "{err}"
    );
}
