//! From the switch-and-job flags to a [`WorkerConfig`]: the job secret
//! (by [`proto::secret`]'s rules), a self-provisioned job's spec (its
//! tenant, key, name and shape), and how messages name the job before the
//! switch gave it an id.
//!
//! A job is named exactly one way, declared (`--job` and its secret) or
//! self-provisioned (`--tenant`, its key, `--job-name`): a mix of the two
//! or half of one is refused here, before any packet leaves.

use std::net::SocketAddrV4;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use proto::provision::{JobName, TenantName};
use proto::secret;
use proto::tag::AuthMode;
use proto::wire::SECRET_LEN;
use worker::{ProvisionSpec, WorkerConfig};

use crate::args::{JobArgs, SwitchJobArgs};

/// The job secret from exactly one of --secret-file, AGGSWITCH_SECRET and
/// --secret; warns (once, on stderr) about a command-line secret or a file
/// others can read.
fn job_secret(t: &SwitchJobArgs) -> Result<[u8; SECRET_LEN]> {
    let r = secret::resolve(secret::SecretInputs {
        arg: t.secret.clone(),
        file: t
            .secret_file
            .as_ref()
            .map(|p| (p.clone(), read_secret_file(p))),
        env: std::env::var(secret::SECRET_ENV).ok(),
    })?;
    for w in &r.warnings {
        tracing::warn!("{w}");
    }
    Ok(r.secret)
}

/// A secret file's text and permission bits.
fn read_secret_file(path: &Path) -> std::io::Result<(String, u32)> {
    use std::os::unix::fs::PermissionsExt;
    let f = std::fs::File::open(path)?;
    let mode = f.metadata()?.permissions().mode();
    Ok((std::io::read_to_string(f)?, mode))
}

/// How the job is named: exactly one of a declared job (`--job` and its
/// secret) and a self-provisioned one (`--tenant`, the tenant key,
/// `--job-name`).
const ONE_WAY: &str = "name the job one way: --job ID with --secret-file (a declared job), or \
                       --tenant T --tenant-key-file F --job-name NAME (a self-provisioned job)";

/// The self-provisioned job's spec, or `None` for a declared job; refuses a
/// mix of the two ways and a half-given one.
fn provision_spec(t: &SwitchJobArgs) -> Result<Option<ProvisionSpec>> {
    let declared = t.job.is_some() || t.secret.is_some() || t.secret_file.is_some();
    let provisioned = t.tenant.is_some() || t.tenant_key_file.is_some() || t.job_name.is_some();
    let shape = t.auth.is_some() || t.priority.is_some() || t.stats;
    match (declared, provisioned) {
        (true, true) => {
            bail!("both a declared job and a self-provisioned one are given: {ONE_WAY}")
        }
        (false, false) => bail!("no job: {ONE_WAY}"),
        (true, false) if shape => bail!(
            "--auth, --priority and --stats shape a self-provisioned job; a declared job's \
             come from its declaration: drop them, or {ONE_WAY}"
        ),
        (true, false) => {
            if t.job.is_none() {
                bail!("a secret without --job: {ONE_WAY}");
            }
            return Ok(None);
        }
        (false, true) => {}
    }
    let (Some(tenant), Some(job_name)) = (&t.tenant, &t.job_name) else {
        bail!("a self-provisioned job needs --tenant and --job-name: {ONE_WAY}");
    };
    let tenant = TenantName::new(tenant).context("--tenant")?;
    let job_name = JobName::new(job_name).context("--job-name")?;
    let r = secret::resolve_tenant_key(
        t.tenant_key_file
            .as_ref()
            .map(|p| (p.clone(), read_secret_file(p))),
        std::env::var(secret::TENANT_KEY_ENV).ok(),
    )?;
    for w in &r.warnings {
        tracing::warn!("{w}");
    }
    let auth = match t.auth.as_deref() {
        None | Some("port") => AuthMode::Port,
        Some("mac") => AuthMode::Mac,
        Some(o) => bail!("--auth {o:?}: use port or mac"),
    };
    let priority = match t.priority.as_deref() {
        Some("low") => 0,
        None | Some("normal") => 1,
        Some("high") => 2,
        Some(o) => bail!("--priority {o:?}: use low, normal or high"),
    };
    Ok(Some(ProvisionSpec {
        tenant,
        key: r.key,
        job_name,
        auth,
        stats: t.stats,
        priority,
    }))
}

/// How messages name the job before the switch gave it an id.
pub(crate) fn job_label(t: &SwitchJobArgs) -> String {
    match (t.job, &t.tenant, &t.job_name) {
        (Some(id), _, _) => format!("job {id}"),
        (None, Some(tenant), Some(name)) => format!("job {name:?} of tenant {tenant:?}"),
        _ => "the job".into(),
    }
}

pub(crate) fn config(a: &JobArgs) -> Result<WorkerConfig> {
    let t = &a.target;
    if a.rank >= t.workers {
        bail!("--rank {} must be below --workers {}", a.rank, t.workers);
    }
    let switch = SocketAddrV4::new(t.switch, t.port);
    let mut c = match (provision_spec(t)?, t.job) {
        (Some(spec), _) => WorkerConfig::provisioned(switch, spec, a.rank, t.workers),
        (None, Some(job)) => WorkerConfig::new(switch, job, a.rank, t.workers, job_secret(t)?),
        (None, None) => bail!("no job: {ONE_WAY}"),
    };
    c.dtype = t.dtype;
    c.join_timeout = Duration::from_secs_f64(t.join_timeout);
    c.stall_timeout = Duration::from_secs_f64(a.stall_timeout);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{allreduce_args, Cli, Cmd};
    use clap::Parser;

    #[test]
    fn secret_file_is_read_with_its_newline_and_a_missing_one_names_path_and_errno() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("worker-secret-{}", std::process::id()));
        let hex = "0123456789abcdef".repeat(4);
        std::fs::write(&path, format!("{hex}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let args = |p: &Path| {
            let mut a = allreduce_args(&[]).unwrap().job.target;
            a.secret = None;
            a.secret_file = Some(p.to_owned());
            a
        };
        let got = job_secret(&args(&path));
        std::fs::remove_file(&path).unwrap();
        assert_eq!(got.unwrap()[..2], [0x01, 0x23]);
        let e = format!("{:#}", job_secret(&args(&path)).unwrap_err());
        assert!(
            e.contains(&path.display().to_string()) && e.contains("os error 2"),
            "{e}"
        );
    }

    /// `worker allreduce` of a self-provisioned job, without its key.
    fn provisioned_args(extra: &[&str]) -> SwitchJobArgs {
        let mut argv = vec![
            "worker",
            "allreduce",
            "--switch",
            "198.18.0.1",
            "--rank",
            "1",
            "--workers",
            "3",
            "--elements",
            "8",
        ];
        argv.extend_from_slice(extra);
        match Cli::try_parse_from(argv).unwrap().cmd {
            Cmd::Allreduce(a) => a.job.target,
            Cmd::Join(_) => unreachable!(),
        }
    }

    #[test]
    fn a_self_provisioned_job_is_named_by_tenant_key_file_and_job_name_and_only_one_way() {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("worker-tenant-key-{}", std::process::id()));
        let hex = "0123456789abcdef".repeat(4);
        std::fs::write(&path, format!("{hex}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let key = path.to_str().unwrap();
        let base = [
            "--tenant",
            "vision",
            "--tenant-key-file",
            key,
            "--job-name",
            "run-7",
        ];
        let spec = provision_spec(&provisioned_args(&base)).unwrap().unwrap();
        assert_eq!(
            (spec.tenant.as_str(), spec.job_name.as_str()),
            ("vision", "run-7")
        );
        assert_eq!(spec.key[..2], [0x01, 0x23]);
        assert_eq!(
            (spec.auth, spec.stats, spec.priority),
            (AuthMode::Port, false, 1)
        );
        let mut shaped = base.to_vec();
        shaped.extend(["--auth", "mac", "--priority", "high", "--stats"]);
        let spec = provision_spec(&provisioned_args(&shaped)).unwrap().unwrap();
        assert_eq!(
            (spec.auth, spec.stats, spec.priority),
            (AuthMode::Mac, true, 2)
        );
        let a = provisioned_args(&base);
        assert_eq!(job_label(&a), "job \"run-7\" of tenant \"vision\"");
        let cfg = config(&JobArgs {
            target: a,
            rank: 1,
            stall_timeout: 5.0,
        })
        .unwrap();
        assert_eq!(cfg.job, 0);
        assert!(cfg.provision.is_some());

        let err = |extra: &[&str]| {
            format!(
                "{:#}",
                provision_spec(&provisioned_args(extra)).unwrap_err()
            )
        };
        // Both ways, neither, half of one.
        let mut both = base.to_vec();
        both.extend(["--job", "3"]);
        let e = err(&both);
        assert!(
            e.contains("both a declared job and a self-provisioned one")
                && e.contains("--tenant-key-file F"),
            "{e}"
        );
        let e = err(&[]);
        assert!(
            e.contains("no job") && e.contains("--job ID with --secret-file"),
            "{e}"
        );
        let e = err(&["--tenant", "vision", "--tenant-key-file", key]);
        assert!(e.contains("needs --tenant and --job-name"), "{e}");
        let e = err(&[
            "--tenant",
            "vision",
            "--tenant-key-file",
            key,
            "--job-name",
            "a b",
        ]);
        assert!(
            e.contains("--job-name") && e.contains("not a valid name"),
            "{e}"
        );
        let e = err(&["--job", "3", "--secret", "00", "--stats"]);
        assert!(e.contains("shape a self-provisioned job"), "{e}");
        let mut bad = base.to_vec();
        bad.extend(["--auth", "gmac"]);
        assert!(err(&bad).contains("use port or mac"));
        std::fs::remove_file(&path).unwrap();
        // The key file is read by the secret rules: a missing one names it.
        let e = err(&base);
        assert!(
            e.contains("reading the tenant key file") && e.contains(key),
            "{e}"
        );
    }
}
