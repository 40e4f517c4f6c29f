//! What a testbed is, as `scripts/testbed.sh up ... --print-env` printed it:
//! one `key=value` line per namespace, address, port and MAC (issue 24: the
//! scripts and the tests read the testbed's addresses, none carries its own
//! copy of the address plan).
//!
//! Owns: [`TestbedEnv`] (the parsed lines and the command that printed
//! them) and [`EnvError`]. Invariant: a key the script did not print, or a
//! value that is not what its key says, is an error naming the key, the
//! value and the command, never a default.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

/// A key `testbed.sh --print-env` did not print, or printed unreadably.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    #[error("`{command}` printed no `{key}=` line; testbed.sh's print_env (or print_env_leafspine) must print it")]
    Missing { key: String, command: String },
    #[error("`{command}` printed `{key}={value}`, which is not {what}")]
    Invalid {
        key: String,
        value: String,
        what: &'static str,
        command: String,
    },
}

/// The `key=value` lines of one `testbed.sh up --print-env`.
#[derive(Debug, Clone)]
pub struct TestbedEnv {
    vars: BTreeMap<String, String>,
    /// The command line that printed them, for messages.
    command: String,
}

impl TestbedEnv {
    /// Parses the script's stdout (lines without `=` are not the script's
    /// and are ignored); `command` is how messages name it.
    pub fn parse(command: impl Into<String>, stdout: &str) -> TestbedEnv {
        TestbedEnv {
            vars: stdout
                .lines()
                .filter_map(|l| l.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect(),
            command: command.into(),
        }
    }

    /// The command line that printed these lines.
    pub fn command(&self) -> &str {
        &self.command
    }

    pub fn lookup(&self, key: &str) -> Result<&str, EnvError> {
        self.vars
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| EnvError::Missing {
                key: key.to_owned(),
                command: self.command.clone(),
            })
    }

    fn parsed<T: std::str::FromStr>(&self, key: &str, what: &'static str) -> Result<T, EnvError> {
        let value = self.lookup(key)?;
        value.parse().map_err(|_| EnvError::Invalid {
            key: key.to_owned(),
            value: value.to_owned(),
            what,
            command: self.command.clone(),
        })
    }

    pub fn lookup_addr(&self, key: &str) -> Result<Ipv4Addr, EnvError> {
        self.parsed(key, "an IPv4 address")
    }

    pub fn lookup_net(&self, key: &str) -> Result<Ipv4Net, EnvError> {
        self.parsed(key, "an IPv4 prefix (A.B.C.D/LEN)")
    }

    pub fn lookup_u16(&self, key: &str) -> Result<u16, EnvError> {
        self.parsed(key, "a number 0..65535")
    }

    /// The value of `key`; panics with [`EnvError`]'s message if missing.
    pub fn get(&self, key: &str) -> &str {
        self.lookup(key).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The IPv4 address under `key`; panics naming key and command.
    pub fn addr(&self, key: &str) -> Ipv4Addr {
        self.lookup_addr(key).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The IPv4 prefix under `key` (e.g. `subnet`); panics naming key and
    /// command.
    pub fn net(&self, key: &str) -> Ipv4Net {
        self.lookup_net(key).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The number under `key` (e.g. `workers`); panics naming key and
    /// command.
    pub fn number(&self, key: &str) -> u16 {
        self.lookup_u16(key).unwrap_or_else(|e| panic!("{e}"))
    }

    /// The space-separated words under `key` (e.g. `ports`).
    pub fn words(&self, key: &str) -> Vec<String> {
        self.get(key)
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }
}

/// The shortest list of prefixes that holds exactly `addrs` (an allow-list
/// that lets in these addresses and no other).
pub fn exact_prefixes(addrs: impl IntoIterator<Item = Ipv4Addr>) -> Vec<Ipv4Net> {
    let hosts: Vec<Ipv4Net> = addrs.into_iter().map(Ipv4Net::from).collect();
    Ipv4Net::aggregate(&hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CMD: &str = "scripts/testbed.sh up --workers 2 --prefix t --print-env";

    fn env() -> TestbedEnv {
        TestbedEnv::parse(
            CMD,
            "prefix=t\nswitch_addr=198.18.0.1\nsubnet=198.18.0.0/24\nworkers=2\n\
             ports=sw-w0 sw-w1\nworker_0_addr=198.18.0.1O\n",
        )
    }

    #[test]
    fn values_parse_by_type() {
        let e = env();
        assert_eq!(e.addr("switch_addr"), Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(e.net("subnet").to_string(), "198.18.0.0/24");
        assert_eq!(e.number("workers"), 2);
        assert_eq!(e.words("ports"), ["sw-w0", "sw-w1"]);
        assert_eq!(e.command(), CMD);
    }

    /// The message names the key and the command that should have printed it.
    #[test]
    fn a_missing_key_names_the_key_and_the_command() {
        let err = env().lookup("host_0_addr").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("`host_0_addr=`"), "{msg}");
        assert!(msg.contains(CMD), "{msg}");
        let panicked = std::panic::catch_unwind(|| env().addr("host_0_addr")).unwrap_err();
        let text = panicked.downcast_ref::<String>().unwrap();
        assert_eq!(*text, msg);
    }

    #[test]
    fn an_unreadable_value_names_key_value_and_command() {
        let msg = env().lookup_addr("worker_0_addr").unwrap_err().to_string();
        for part in ["worker_0_addr=198.18.0.1O", "an IPv4 address", CMD] {
            assert!(msg.contains(part), "{part:?} not in {msg}");
        }
        assert!(env().lookup_net("switch_addr").is_err());
    }

    #[test]
    fn exact_prefixes_hold_exactly_the_addresses() {
        let w = |i: u8| Ipv4Addr::new(198, 18, 0, 10 + i);
        let four: Vec<String> = exact_prefixes((0..4).map(w))
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(four, ["198.18.0.10/31", "198.18.0.12/31"]);
        // 64 workers, .10 ..= .73: no host (.100 on) and nothing past .73.
        let nets = exact_prefixes((0..64).map(w));
        for last in 0..=255u8 {
            let a = Ipv4Addr::new(198, 18, 0, last);
            let want = (10..=73).contains(&last);
            assert_eq!(nets.iter().any(|n| n.contains(&a)), want, "{a} in {nets:?}");
        }
        assert!(exact_prefixes([]).is_empty());
    }
}
