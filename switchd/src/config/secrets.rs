//! Job secrets in the configuration: parsing a secret's 64 hex digits
//! (refusing a weak one), and the warning for a file that holds secrets
//! others can read.
//!
//! Invariant: a secret that parsed is 32 bytes and not every byte the
//! same; the messages never contain the secret.

use std::path::Path;

use proto::wire::SECRET_LEN;

use super::file::Config;

/// Parses a job's secret of 64 hex digits and refuses a weak one (every
/// byte the same, all zeros included): anyone guesses it at once.
pub fn parse_secret(s: &str) -> Result<[u8; SECRET_LEN], String> {
    let from = proto::secret::SecretSource::Arg;
    let secret = proto::secret::parse_secret(s, &from).map_err(|e| match e {
        proto::secret::SecretError::NotHex { detail, .. } => {
            format!("secret is not hex: {detail}")
        }
        proto::secret::SecretError::Length { got, .. } => format!(
            "secret must be {SECRET_LEN} bytes (64 hex digits), got {got} bytes; {}",
            proto::secret::HOW_TO_MAKE
        ),
        e => e.to_string(),
    })?;
    if proto::secret::is_weak(&secret) {
        return Err(format!(
            "secret is weak (every byte is {:#04x}) and is refused; {}",
            secret[0],
            proto::secret::HOW_TO_MAKE
        ));
    }
    Ok(secret)
}

/// The warning for a configuration file that declares jobs (so holds their
/// secrets) and that group or others can read; `None` when only its owner
/// can, when it declares no job, or when its mode cannot be read.
pub fn secrets_exposure(path: &Path, cfg: &Config) -> Option<String> {
    use std::os::unix::fs::PermissionsExt;
    if cfg.jobs.is_empty() {
        return None;
    }
    let mode = std::fs::metadata(path).ok()?.permissions().mode();
    proto::secret::exposure_warning(path, mode)
}
