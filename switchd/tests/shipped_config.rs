//! The config the Debian package ships (packaging/switchd.toml, installed
//! as /etc/aggswitch/switchd.toml) against this switchd: as shipped it is
//! refused with the message that says to fill in the ports; with ports and
//! addresses filled in `switchd check-config` accepts it; every `#key =
//! value` line of `[switch]` and `[[tenant]]` shows switchd's default
//! (uncommenting it changes nothing) unless the comment above it calls it
//! an example, and every key switchd writes for them is there; with every
//! setting uncommented (a real key file for the tenant) the file parses,
//! one job and one tenant. So the file cannot rot as switchd's keys and
//! defaults change.
//!
//! The file's convention: a setting is a line `#key = value` (no space
//! after the `#`), a commented section header is `#[[job]]` or
//! `#[[tenant]]`, and explanations start with `# `.

use std::path::Path;
use std::process::Command;

use switchd::config::{Config, ConfigError, ConfigFile};

const SHIPPED: &str = include_str!("../../packaging/switchd.toml");
const PORTS: &str = r#"ports = ["ens1f0", "ens1f1"]"#;
const ADDRESSES: &str = r#"addresses = ["198.18.0.1"]"#;
/// A secret that parses (not one repeated byte), for the [[job]] example.
const SECRET: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// The settings a `[[tenant]]` must have (the rest have defaults).
const TENANT_REQUIRED: &str = "name = \"stand-in\"\nkey_file = \"/nonexistent/stand-in.key\"\n\
                               allowed_sources = [\"10.0.0.0/8\"]\n";

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("switchd.toml"), |_| Some(1500))
}

/// The shipped file with its empty `ports` and `addresses` filled in.
fn filled_in() -> String {
    assert_eq!(SHIPPED.matches("\nports = []\n").count(), 1);
    assert_eq!(SHIPPED.matches("\naddresses = []\n").count(), 1);
    SHIPPED
        .replace("\nports = []\n", &format!("\n{PORTS}\n"))
        .replace("\naddresses = []\n", &format!("\n{ADDRESSES}\n"))
}

/// The lines of the part of the file from the line `start` to the next
/// (commented) section header or the end.
fn part<'a>(text: &'a str, start: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| *l != start);
    assert!(lines.next().is_some(), "no line {start:?} in the file");
    lines
        .take_while(|l| !l.starts_with("#[[") && !l.starts_with('['))
        .collect()
}

/// A setting line `#key = value`: (key, the line without its `#`).
fn setting(line: &str) -> Option<(&str, &str)> {
    let body = line.strip_prefix('#')?;
    let (key, _) = body.split_once(" = ")?;
    (!key.is_empty() && key.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'))
        .then_some((key, body))
}

/// Each setting of `lines` with whether it is an example (the comment
/// line above it ends with "Example:").
fn settings<'a>(lines: &[&'a str]) -> Vec<(&'a str, &'a str, bool)> {
    lines
        .iter()
        .enumerate()
        .filter_map(|(i, l)| {
            let (key, body) = setting(l)?;
            let example = i > 0 && lines[i - 1].trim_end().ends_with("Example:");
            Some((key, body, example))
        })
        .collect()
}

/// The file as written (serde only: no key file is read), its `[switch]`
/// and its first `[[tenant]]` as switchd writes them back (every default
/// filled in).
fn written(text: &str) -> (toml::Table, Option<toml::Table>) {
    let file: ConfigFile = toml::from_str(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    (
        toml::Table::try_from(&file.switch).expect("serializing [switch]"),
        file.tenants
            .first()
            .map(|t| toml::Table::try_from(t).expect("serializing a [[tenant]]")),
    )
}

fn minimal(extra: &str) -> String {
    format!("[switch]\n{PORTS}\n{ADDRESSES}\n{extra}\n")
}

/// Each `#key = value` of the part `start` of the file against `section`
/// of `text(line)`, a config with only that line uncommented: a setting
/// not called an example must leave the section as switchd's defaults,
/// an example must change it. Then every key switchd writes for the
/// defaults (but `skip`) must be among the settings. Returns how many
/// settings there were.
fn check_defaults(
    start: &str,
    text: impl Fn(&str) -> String,
    section: impl Fn(&str) -> toml::Table,
    skip: &[&str],
) -> usize {
    let defaults = section(&text(""));
    let shown = settings(&part(SHIPPED, start));
    for (key, line, example) in &shown {
        let table = section(&text(line));
        if *example {
            assert_ne!(
                table, defaults,
                "`#{line}` is called an example but is the default"
            );
        } else {
            assert_eq!(
                table.get(*key),
                defaults.get(*key),
                "`#{line}` is shown as the default of {key}, but switchd's default differs"
            );
            assert_eq!(table, defaults, "uncommenting `#{line}` changes the config");
        }
    }
    for key in defaults.keys() {
        assert!(
            skip.contains(&key.as_str()) || shown.iter().any(|(k, _, _)| k == key),
            "{start} {key} is not in packaging/switchd.toml: add it with its default"
        );
    }
    shown.len()
}

#[test]
fn as_shipped_it_is_refused_with_the_message_to_fill_in_the_ports() {
    let e = parse(SHIPPED).unwrap_err().to_string();
    assert!(
        e.contains("switch.ports is empty: list the interfaces to attach to"),
        "{e}"
    );
}

#[test]
fn with_ports_and_addresses_filled_in_switchd_check_config_accepts_it() {
    let cfg = parse(&filled_in()).unwrap();
    assert!(cfg.jobs.is_empty());
    assert_eq!(cfg.switch.ports, ["ens1f0", "ens1f1"]);
    let dir = std::env::temp_dir().join(format!(
        "switchd-shipped-config-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir(&dir).unwrap();
    let path = dir.join("switchd.toml");
    std::fs::write(&path, filled_in()).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_switchd"))
        .args(["check-config", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stdout.contains(": ok: 2 ports"), "{stdout}");
}

#[test]
fn every_switch_setting_shown_is_the_default_unless_called_an_example() {
    let n = check_defaults(
        "[switch]",
        minimal,
        |text| written(text).0,
        &["ports", "addresses"],
    );
    assert!(n >= 19, "too few [switch] settings found: {n}");
}

#[test]
fn every_tenant_setting_shown_is_the_default_unless_called_an_example() {
    let n = check_defaults(
        "#[[tenant]]",
        // The line after the required keys: a shown required key replaces
        // the stand-in's (TOML takes neither twice, so drop the stand-in).
        |line| {
            let key = line.split(" = ").next().unwrap_or_default();
            let required: String = TENANT_REQUIRED
                .lines()
                .filter(|l| key.is_empty() || !l.starts_with(&format!("{key} = ")))
                .map(|l| format!("{l}\n"))
                .collect();
            minimal(&format!("[[tenant]]\n{required}{line}"))
        },
        |text| written(text).1.expect("a [[tenant]]"),
        &[],
    );
    assert!(n >= 12, "too few [[tenant]] settings found: {n}");
}

/// The shipped file with ports and addresses filled in and every setting
/// and commented section header uncommented.
fn all_uncommented() -> String {
    filled_in()
        .lines()
        .map(|l| match setting(l) {
            Some((_, body)) => body.to_owned(),
            None if l == "#[[job]]" || l == "#[[tenant]]" => l[1..].to_owned(),
            None => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn with_every_setting_uncommented_it_parses_one_job_and_one_tenant() {
    let dir = std::env::temp_dir().join(format!(
        "switchd-shipped-tenant-{}-{:x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir(&dir).unwrap();
    let key = dir.join("team-a.key");
    std::fs::write(&key, format!("{SECRET}\n")).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut text = all_uncommented();
    assert_eq!(text.matches("secret = \"<64 hex digits>\"").count(), 1);
    assert_eq!(
        text.matches("key_file = \"/etc/aggswitch/tenants/team-a.key\"")
            .count(),
        1
    );
    text = text
        .replace("<64 hex digits>", SECRET)
        .replace("/etc/aggswitch/tenants/team-a.key", &key.to_string_lossy());
    let parsed = Config::parse(&text, &dir.join("switchd.toml"), |_| Some(1500));
    std::fs::remove_dir_all(&dir).unwrap();
    let cfg = parsed.unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(cfg.jobs.len(), 1);
    let job = &cfg.jobs[0];
    assert_eq!((job.id, job.n_workers, job.pool_slots), (1, 4, 256));
    assert_eq!(cfg.switch.pool_memory_mib, Some(4096));
    assert_eq!(cfg.tenants.len(), 1);
    assert_eq!(cfg.tenants[0].job_ids, (32768, 65535));
}

#[test]
fn the_job_and_tenant_examples_are_commented_out() {
    for start in ["#[[job]]", "#[[tenant]]"] {
        for l in part(SHIPPED, start) {
            assert!(
                l.is_empty() || l.starts_with('#'),
                "a line of the {start} example is not commented out: {l:?}"
            );
        }
    }
    assert!(SHIPPED.contains("A config with [[tenant]] sections and no [[job]]\n# is valid."));
}
