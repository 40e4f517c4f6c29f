//! Secrets in the configuration: a job's secret (64 hex digits in the
//! file), a tenant's key (64 hex digits in a file of its own), the rule
//! that refuses a weak one, and the warnings for a file that holds secrets
//! others can read.
//!
//! Invariant: a secret or key that parsed is 32 bytes, not every byte the
//! same and not a counting pattern; the messages never contain the secret.

use std::path::Path;

use proto::provision::TenantKey;
use proto::wire::SECRET_LEN;

use super::file::Config;

/// Why 32 bytes are guessed at once: every byte the same (all zeros
/// included), or bytes counting up or down by one (`00 01 02 …`).
fn weakness(b: &[u8; SECRET_LEN]) -> Option<String> {
    if !proto::secret::is_weak(b) {
        return None;
    }
    // `is_weak` is the rule; this only words which pattern it is.
    let steps = |d: u8| b.windows(2).all(|w| w[1] == w[0].wrapping_add(d));
    Some(if steps(0) {
        format!("every byte is {:#04x}", b[0])
    } else {
        format!(
            "its bytes count {} from {:#04x}",
            if steps(1) { "up" } else { "down" },
            b[0]
        )
    })
}

/// 64 hex digits of `what` ("secret", "tenant key"), refusing a weak one.
fn parse_key(s: &str, what: &str) -> Result<[u8; SECRET_LEN], String> {
    let from = proto::secret::SecretSource::Arg;
    let secret = proto::secret::parse_secret(s, &from).map_err(|e| match e {
        proto::secret::SecretError::NotHex { detail, .. } => {
            format!(
                "{what} is not hex: {detail}; {}",
                proto::secret::HOW_TO_MAKE
            )
        }
        proto::secret::SecretError::Length { got, .. } => format!(
            "{what} must be {SECRET_LEN} bytes (64 hex digits), got {got} bytes; {}",
            proto::secret::HOW_TO_MAKE
        ),
        e => e.to_string(),
    })?;
    if let Some(why) = weakness(&secret) {
        return Err(format!(
            "{what} is weak ({why}) and is refused; {}",
            proto::secret::HOW_TO_MAKE
        ));
    }
    Ok(secret)
}

/// Parses a job's secret of 64 hex digits and refuses a weak one (every
/// byte the same, all zeros included, or a counting pattern): anyone
/// guesses it at once.
pub fn parse_secret(s: &str) -> Result<[u8; SECRET_LEN], String> {
    parse_key(s, "secret")
}

/// Parses a tenant key's text (64 hex digits, surrounding whitespace
/// allowed), refusing a weak one by the rules of [`parse_secret`].
pub fn parse_tenant_key(s: &str) -> Result<TenantKey, String> {
    parse_key(s, "tenant key")
}

/// A tenant key read from its file, and the warning the file deserves when
/// group or others can read it. Errors name the file and say what to do.
pub fn read_tenant_key(path: &Path) -> Result<(TenantKey, Option<String>), String> {
    use std::os::unix::fs::PermissionsExt;
    let read = || -> std::io::Result<(String, u32)> {
        let f = std::fs::File::open(path)?;
        let mode = f.metadata()?.permissions().mode();
        Ok((std::io::read_to_string(f)?, mode))
    };
    let (text, mode) = read().map_err(|e| {
        format!(
            "reading key_file {}: {e} (make one with `openssl rand -hex 32 > {0}; chmod 600 {0}`)",
            path.display()
        )
    })?;
    let key = parse_tenant_key(&text).map_err(|e| format!("key_file {}: {e}", path.display()))?;
    Ok((key, key_file_warning(path, mode)))
}

/// The warning for a tenant key file that group or others can read (`mode`
/// its permission bits), or `None` when only its owner can.
pub fn key_file_warning(path: &Path, mode: u32) -> Option<String> {
    (mode & 0o077 != 0).then(|| {
        format!(
            "tenant key file {} is readable by group or others (mode {:04o}): anyone who \
             reads it can create jobs as the tenant; chmod 600 {}",
            path.display(),
            mode & 0o7777,
            path.display()
        )
    })
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
