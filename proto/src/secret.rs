//! Job secrets as operators hand them to the tools: 64 hex digits from a
//! file (`--secret-file`), the environment ([`SECRET_ENV`]) or, discouraged,
//! the command line (`--secret`), and the rules a secret must pass; tenant
//! keys (self-provisioned jobs) by the same rules from `--tenant-key-file`
//! or [`TENANT_KEY_ENV`] ([`resolve_tenant_key`]; never the command line).
//!
//! Owns: parsing a secret's text, picking exactly one source, the warnings
//! an exposed secret deserves, and the weak-secret rule switchd enforces.
//! No I/O: the caller reads the file (and its mode) and the environment and
//! passes what it found, so every rule is tested without a filesystem.
//!
//! Invariants: a [`Secret`] that left [`resolve`] is exactly
//! [`SECRET_LEN`] bytes; errors name where the secret came from and say
//! what to do; the secret's digits never appear in an error or warning.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::wire::SECRET_LEN;

/// The environment variable `worker` and `switchctl` read a secret from.
pub const SECRET_ENV: &str = "AGGSWITCH_SECRET";

/// How an operator makes a good secret (quoted in errors).
pub const HOW_TO_MAKE: &str =
    "make one with `openssl rand -hex 32` or `head -c32 /dev/urandom | xxd -p -c64`";

/// A job secret (32 bytes).
pub type Secret = [u8; SECRET_LEN];

/// Where a secret came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretSource {
    /// `--secret HEX` on the command line.
    Arg,
    /// `--secret-file PATH`.
    File(PathBuf),
    /// The [`SECRET_ENV`] variable.
    Env,
}

impl fmt::Display for SecretSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SecretSource::Arg => write!(f, "--secret"),
            SecretSource::File(p) => write!(f, "--secret-file {}", p.display()),
            SecretSource::Env => write!(f, "environment variable {SECRET_ENV}"),
        }
    }
}

/// Why a secret could not be had.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error(
        "no job secret: pass --secret-file PATH (64 hex digits, mode 0600) or set \
         {SECRET_ENV}"
    )]
    Missing,
    #[error("the job secret is given twice ({first} and {second}): give exactly one")]
    Conflict {
        first: SecretSource,
        second: SecretSource,
    },
    #[error("reading the secret file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the secret from {from} is not hex digits ({detail}); {HOW_TO_MAKE}")]
    NotHex { from: SecretSource, detail: String },
    #[error(
        "the secret from {from} is {got} bytes, it must be {SECRET_LEN} bytes (64 hex \
         digits); {HOW_TO_MAKE}"
    )]
    Length { from: SecretSource, got: usize },
}

/// What the caller found in each place a secret may come from.
#[derive(Debug, Default)]
pub struct SecretInputs {
    /// `--secret HEX`.
    pub arg: Option<String>,
    /// `--secret-file PATH`, and what reading it gave: its text and its
    /// permission bits (`st_mode & 0o7777`).
    pub file: Option<(PathBuf, std::io::Result<(String, u32)>)>,
    /// The value of [`SECRET_ENV`], if set.
    pub env: Option<String>,
}

/// A secret and what the operator should be told about how it was given.
#[derive(Debug)]
pub struct Resolved {
    pub secret: Secret,
    pub source: SecretSource,
    /// One line each, for stderr.
    pub warnings: Vec<String>,
}

/// Parses 64 hex digits; surrounding whitespace (a file's trailing newline)
/// is allowed.
pub fn parse_secret(text: &str, from: &SecretSource) -> Result<Secret, SecretError> {
    let v = decode_hex(text.trim()).map_err(|detail| SecretError::NotHex {
        from: from.clone(),
        detail,
    })?;
    v.try_into().map_err(|v: Vec<u8>| SecretError::Length {
        from: from.clone(),
        got: v.len(),
    })
}

fn decode_hex(s: &str) -> Result<Vec<u8>, String> {
    let digit = |c: u8, at: usize| {
        (c as char)
            .to_digit(16)
            .map(|d| d as u8)
            .ok_or_else(|| format!("character {} is not a hex digit", at + 1))
    };
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return Err(format!("{} digits, an odd number", b.len()));
    }
    b.chunks(2)
        .enumerate()
        .map(|(i, p)| Ok(digit(p[0], 2 * i)? << 4 | digit(p[1], 2 * i + 1)?))
        .collect()
}

/// True when every byte is the same (all zeros included) or the bytes
/// count up or down by one (`00 01 02 …`): such a secret or tenant key is
/// guessed at once; switchd and the worker both refuse it.
pub fn is_weak(secret: &Secret) -> bool {
    let steps = |d: u8| secret.windows(2).all(|w| w[1] == w[0].wrapping_add(d));
    steps(0) || steps(1) || steps(u8::MAX)
}

/// The warning for a file holding secrets that group or others may read
/// (`mode` is its permission bits), or `None` when only its owner can.
pub fn exposure_warning(path: &Path, mode: u32) -> Option<String> {
    (mode & 0o077 != 0).then(|| {
        format!(
            "{} holds secrets and is readable by group or others (mode {:04o}): \
             chmod 600 {}",
            path.display(),
            mode & 0o7777,
            path.display()
        )
    })
}

/// The warning for a secret given with `--secret`.
pub fn command_line_warning() -> String {
    format!(
        "--secret puts the job secret in /proc/PID/cmdline, where every user of this \
         machine can read it: use --secret-file PATH (mode 0600) or the environment \
         variable {SECRET_ENV} instead"
    )
}

/// Picks the one source given, parses it, and collects the warnings it
/// deserves (a command-line secret; a file group or others can read).
pub fn resolve(inputs: SecretInputs) -> Result<Resolved, SecretError> {
    let mut given = Vec::new();
    if inputs.arg.is_some() {
        given.push(SecretSource::Arg);
    }
    if let Some((p, _)) = &inputs.file {
        given.push(SecretSource::File(p.clone()));
    }
    if inputs.env.is_some() {
        given.push(SecretSource::Env);
    }
    if given.len() > 1 {
        return Err(SecretError::Conflict {
            first: given[0].clone(),
            second: given[1].clone(),
        });
    }
    let mut warnings = Vec::new();
    let (text, source) = match (inputs.arg, inputs.file, inputs.env) {
        (Some(a), None, None) => {
            warnings.push(command_line_warning());
            (a, SecretSource::Arg)
        }
        (None, Some((path, read)), None) => {
            let (text, mode) = read.map_err(|source| SecretError::Read {
                path: path.clone(),
                source,
            })?;
            warnings.extend(exposure_warning(&path, mode));
            (text, SecretSource::File(path))
        }
        (None, None, Some(e)) => (e, SecretSource::Env),
        _ => return Err(SecretError::Missing),
    };
    let secret = parse_secret(&text, &source)?;
    Ok(Resolved {
        secret,
        source,
        warnings,
    })
}

/// The environment variable `worker` reads a tenant key from.
pub const TENANT_KEY_ENV: &str = "AGGSWITCH_TENANT_KEY";

/// Where a tenant key came from, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySource {
    /// `--tenant-key-file PATH` (or the Python path's
    /// `AGGSWITCH_TENANT_KEY_FILE`).
    File(PathBuf),
    /// The [`TENANT_KEY_ENV`] variable.
    Env,
}

impl fmt::Display for KeySource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeySource::File(p) => write!(f, "tenant key file {}", p.display()),
            KeySource::Env => write!(f, "environment variable {TENANT_KEY_ENV}"),
        }
    }
}

/// Why a tenant key could not be had.
#[derive(Debug, thiserror::Error)]
pub enum TenantKeyError {
    #[error(
        "no tenant key: pass --tenant-key-file PATH (64 hex digits, mode 0600) or set \
         {TENANT_KEY_ENV}"
    )]
    Missing,
    #[error("the tenant key is given twice ({first} and {second}): give exactly one")]
    Conflict { first: KeySource, second: KeySource },
    #[error("reading the tenant key file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("the tenant key from {from} is not hex digits ({detail}); {HOW_TO_MAKE}")]
    NotHex { from: KeySource, detail: String },
    #[error(
        "the tenant key from {from} is {got} bytes, it must be {SECRET_LEN} bytes (64 hex \
         digits); {HOW_TO_MAKE}"
    )]
    Length { from: KeySource, got: usize },
    #[error(
        "the tenant key from {from} is weak (every byte the same): no switch takes it; \
         {HOW_TO_MAKE}"
    )]
    Weak { from: KeySource },
}

/// A tenant key and the warnings it deserves (a file group or others can
/// read).
#[derive(Debug)]
pub struct ResolvedKey {
    pub key: Secret,
    pub source: KeySource,
    pub warnings: Vec<String>,
}

/// The tenant key from exactly one of a file (its path, and what reading
/// it gave: text and permission bits) and the value of [`TENANT_KEY_ENV`]:
/// the rules of a job secret (64 hex digits, not weak, a warning for a file
/// others can read).
pub fn resolve_tenant_key(
    file: Option<(PathBuf, std::io::Result<(String, u32)>)>,
    env: Option<String>,
) -> Result<ResolvedKey, TenantKeyError> {
    let mut warnings = Vec::new();
    let (text, source) = match (file, env) {
        (Some((path, _)), Some(_)) => {
            return Err(TenantKeyError::Conflict {
                first: KeySource::File(path),
                second: KeySource::Env,
            })
        }
        (Some((path, read)), None) => {
            let (text, mode) = read.map_err(|source| TenantKeyError::Read {
                path: path.clone(),
                source,
            })?;
            warnings.extend(exposure_warning(&path, mode));
            (text, KeySource::File(path))
        }
        (None, Some(e)) => (e, KeySource::Env),
        (None, None) => return Err(TenantKeyError::Missing),
    };
    let v = decode_hex(text.trim()).map_err(|detail| TenantKeyError::NotHex {
        from: source.clone(),
        detail,
    })?;
    let key: Secret = v.try_into().map_err(|v: Vec<u8>| TenantKeyError::Length {
        from: source.clone(),
        got: v.len(),
    })?;
    if is_weak(&key) {
        return Err(TenantKeyError::Weak { from: source });
    }
    Ok(ResolvedKey {
        key,
        source,
        warnings,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_key_follows_the_secret_rules_and_says_tenant_key() {
        let r = resolve_tenant_key(file(&format!("{HEX}\n"), 0o644), None).unwrap();
        assert_eq!(r.key[1], 0x11);
        assert_eq!(r.source, KeySource::File(PathBuf::from("/etc/job.key")));
        assert!(r.warnings[0].contains("chmod 600"), "{:?}", r.warnings);
        let r = resolve_tenant_key(None, Some(HEX.into())).unwrap();
        assert!(r.warnings.is_empty());
        let e = resolve_tenant_key(None, None).unwrap_err().to_string();
        assert!(
            e.contains("no tenant key")
                && e.contains("--tenant-key-file")
                && e.contains(TENANT_KEY_ENV),
            "{e}"
        );
        let e = resolve_tenant_key(file(HEX, 0o600), Some(HEX.into()))
            .unwrap_err()
            .to_string();
        assert!(e.contains("tenant key is given twice"), "{e}");
        let e = resolve_tenant_key(file("abc", 0o600), None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("the tenant key from tenant key file /etc/job.key"),
            "{e}"
        );
        let weak = "11".repeat(32);
        let e = resolve_tenant_key(None, Some(weak))
            .unwrap_err()
            .to_string();
        assert!(e.contains("weak") && !e.contains("1111"), "{e}");
        let e = resolve_tenant_key(
            Some((
                PathBuf::from("/nope"),
                Err(std::io::Error::from(std::io::ErrorKind::NotFound)),
            )),
            None,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("reading the tenant key file /nope"), "{e}");
    }

    const HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

    fn file(text: &str, mode: u32) -> Option<(PathBuf, std::io::Result<(String, u32)>)> {
        Some((PathBuf::from("/etc/job.key"), Ok((text.to_string(), mode))))
    }

    #[test]
    fn a_file_with_a_trailing_newline_and_mode_0600_gives_the_secret_silently() {
        let r = resolve(SecretInputs {
            file: file(&format!("{HEX}\n"), 0o600),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.secret[1], 0x11);
        assert_eq!(r.secret[31], 0xff);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    }

    #[test]
    fn a_file_others_can_read_is_used_with_a_chmod_warning() {
        let r = resolve(SecretInputs {
            file: file(HEX, 0o644),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.warnings.len(), 1);
        assert!(
            r.warnings[0].contains("chmod 600 /etc/job.key") && r.warnings[0].contains("0644"),
            "{}",
            r.warnings[0]
        );
        assert!(!r.warnings[0].contains(HEX));
        assert!(exposure_warning(Path::new("x"), 0o640).is_some(), "group");
        assert!(exposure_warning(Path::new("x"), 0o400).is_none());
    }

    #[test]
    fn the_environment_gives_the_secret_silently() {
        let r = resolve(SecretInputs {
            env: Some(HEX.into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.source, SecretSource::Env);
        assert!(r.warnings.is_empty());
    }

    #[test]
    fn the_command_line_still_works_but_warns_and_names_the_alternatives() {
        let r = resolve(SecretInputs {
            arg: Some(HEX.into()),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(r.secret[2], 0x22);
        let w = &r.warnings[0];
        assert!(
            w.contains("/proc/PID/cmdline")
                && w.contains("--secret-file")
                && w.contains(SECRET_ENV),
            "{w}"
        );
    }

    #[test]
    fn two_sources_are_refused_naming_both() {
        let e = resolve(SecretInputs {
            arg: Some(HEX.into()),
            env: Some(HEX.into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--secret and environment variable"), "{e}");
        let e = resolve(SecretInputs {
            file: file(HEX, 0o600),
            env: Some(HEX.into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("--secret-file /etc/job.key"), "{e}");
    }

    #[test]
    fn none_given_says_how_to_give_one() {
        let e = resolve(SecretInputs::default()).unwrap_err().to_string();
        assert!(e.contains("--secret-file") && e.contains(SECRET_ENV), "{e}");
    }

    #[test]
    fn an_unreadable_file_names_the_path_and_the_os_error() {
        let e = resolve(SecretInputs {
            file: Some((
                PathBuf::from("/nope/key"),
                Err(std::io::Error::from_raw_os_error(2)),
            )),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("/nope/key") && e.contains("No such file or directory"),
            "{e}"
        );
    }

    #[test]
    fn bad_digits_and_lengths_say_what_is_wrong_without_echoing_the_secret() {
        let e = resolve(SecretInputs {
            file: file(&format!("{}zz", &HEX[..62]), 0o600),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("character 63 is not a hex digit"), "{e}");
        assert!(e.contains("--secret-file /etc/job.key"), "{e}");
        assert!(!e.contains(&HEX[..62]), "{e}");
        let e = resolve(SecretInputs {
            env: Some(HEX[..62].into()),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("31 bytes") && e.contains("64 hex digits"), "{e}");
        let e = resolve(SecretInputs {
            env: Some(format!("{HEX}0")),
            ..Default::default()
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("odd number"), "{e}");
    }

    #[test]
    fn repeated_byte_secrets_are_weak_others_are_not() {
        assert!(is_weak(&[0; SECRET_LEN]));
        assert!(is_weak(&[0xab; SECRET_LEN]));
        let up: Secret = std::array::from_fn(|i| i as u8);
        let down: Secret = std::array::from_fn(|i| 0xf0u8.wrapping_sub(i as u8));
        assert!(is_weak(&up) && is_weak(&down), "counting patterns");
        let mut s = [0u8; SECRET_LEN];
        s[31] = 1;
        assert!(!is_weak(&s));
        assert!(!is_weak(
            &parse_secret(HEX, &SecretSource::Arg).expect("valid")
        ));
    }
}
