//! The config the Debian package ships (packaging/switchd.toml, installed
//! as /etc/aggswitch/switchd.toml) against this switchd: as shipped it is
//! refused with the message that says to fill in the ports; with ports and
//! addresses filled in `switchd check-config` accepts it; every `#key =
//! value` line of `[switch]` shows switchd's default (uncommenting it
//! changes nothing) unless the comment above it calls it an example; the
//! examples of `[switch]` and `[[job]]` parse; the `[[tenant]]` example is
//! all comments and names every tenant key. So the file cannot rot as
//! switchd's keys and defaults change.
//!
//! The file's convention: a setting is a line `#key = value` (no space
//! after the `#`), a commented section header is `#[[job]]` or
//! `#[[tenant]]`, and explanations start with `# `.

use std::path::Path;
use std::process::Command;

use switchd::config::{Config, ConfigError};

const SHIPPED: &str = include_str!("../../packaging/switchd.toml");
const PORTS: &str = r#"ports = ["ens1f0", "ens1f1"]"#;
const ADDRESSES: &str = r#"addresses = ["198.18.0.1"]"#;
/// A secret that parses (not one repeated byte), for the [[job]] example.
const SECRET: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
/// The keys of a `[[tenant]]` section.
const TENANT_KEYS: [&str; 11] = [
    "name",
    "key_file",
    "allowed_sources",
    "max_jobs",
    "max_workers_per_job",
    "max_pool_bytes",
    "dtypes",
    "auth",
    "max_priority",
    "job_ids",
    "lease_secs",
];

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

/// `[switch]` of a config as switchd writes it back (every default filled in).
fn switch_table(cfg: &Config) -> toml::Table {
    toml::Table::try_from(&cfg.switch).expect("serializing [switch]")
}

fn minimal(extra: &str) -> String {
    format!("[switch]\n{PORTS}\n{ADDRESSES}\n{extra}\n")
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
    let defaults = switch_table(&parse(&minimal("")).unwrap());
    let shown = settings(&part(SHIPPED, "[switch]"));
    assert!(shown.len() >= 15, "too few settings found: {shown:?}");
    for (key, line, example) in &shown {
        let cfg = parse(&minimal(line))
            .unwrap_or_else(|e| panic!("the line `{line}` does not parse: {e}"));
        let table = switch_table(&cfg);
        if *example {
            assert_ne!(
                table, defaults,
                "`{line}` is called an example but is the default"
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
    // Every key switchd writes for a default [switch] is explained.
    for key in defaults.keys() {
        if key == "ports" || key == "addresses" {
            continue;
        }
        assert!(
            shown.iter().any(|(k, _, _)| k == key),
            "[switch] {key} is not in packaging/switchd.toml: add it with its default"
        );
    }
}

#[test]
fn the_switch_and_job_examples_parse_when_uncommented() {
    let mut text = filled_in()
        .lines()
        .map(|l| match setting(l) {
            Some((_, body)) => body.to_owned(),
            None if l == "#[[job]]" => "[[job]]".to_owned(),
            None => l.to_owned(),
        })
        .take_while(|l| l != "#[[tenant]]")
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(text.matches("secret = \"<64 hex digits>\"").count(), 1);
    text = text.replace("<64 hex digits>", SECRET);
    let cfg = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(cfg.jobs.len(), 1);
    let job = &cfg.jobs[0];
    assert_eq!((job.id, job.n_workers, job.pool_slots), (1, 4, 256));
    assert_eq!(cfg.switch.pool_memory_mib, Some(4096));
}

#[test]
fn the_tenant_example_is_all_comments_and_names_every_tenant_key() {
    let tenant = part(SHIPPED, "#[[tenant]]");
    for l in &tenant {
        assert!(
            l.is_empty() || l.starts_with('#'),
            "a line of the [[tenant]] example is not commented out: {l:?}"
        );
    }
    let keys: Vec<&str> = settings(&tenant).iter().map(|(k, _, _)| *k).collect();
    assert_eq!(keys, TENANT_KEYS);
    let intro = SHIPPED.split("#[[tenant]]").next().unwrap();
    assert!(intro.contains("A config with [[tenant]] sections\n# and no [[job]] is valid"));
}
