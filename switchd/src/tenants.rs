//! Tenants as the operator sees them: one [`TenantRow`] per tenant (what
//! `switchctl tenant list` gets over the admin socket, as JSON), the table
//! switchctl prints of them ([`table`]), and the one-line description
//! `switchd check-config` prints ([`describe`]).
//!
//! Invariant: nothing here holds or prints a tenant key; a row is made
//! from a [`TenantConfig`] and the table's usage, never the other way.

use proto::switch::tenant::TenantConfig;
use proto::switch::{human_bytes, Ipv4Prefix};
use serde::{Deserialize, Serialize};

/// One tenant: its declaration (less the key) and what its jobs use now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TenantRow {
    pub name: String,
    pub allowed_sources: Vec<String>,
    /// Jobs it has now, and may have.
    pub jobs: usize,
    pub max_jobs: u16,
    /// Slot-pool bytes its jobs take now, and may take.
    pub pool_bytes: u64,
    pub max_pool_bytes: u64,
    pub max_workers_per_job: u16,
    pub dtypes: Vec<String>,
    pub auth: Vec<String>,
    pub max_priority: String,
    /// `[first, last]`.
    pub job_ids: [u16; 2],
    pub lease_secs: u64,
    pub pool_slots: u16,
    /// On a leaf: `leaf I of N, spines A:P,B:P`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream: Option<String>,
}

fn prefix(p: &Ipv4Prefix) -> String {
    format!("{}/{}", std::net::Ipv4Addr::from(p.addr), p.len)
}

impl TenantRow {
    /// `usage`: the table's `(jobs, pool bytes)` for the tenant (none: 0).
    pub fn new(t: &TenantConfig, usage: Option<(usize, u64)>) -> TenantRow {
        let (jobs, pool_bytes) = usage.unwrap_or((0, 0));
        TenantRow {
            name: t.name.to_string(),
            allowed_sources: t.allowed_sources.iter().map(prefix).collect(),
            jobs,
            max_jobs: t.max_jobs,
            pool_bytes,
            max_pool_bytes: t.max_pool_bytes,
            max_workers_per_job: t.max_workers_per_job,
            dtypes: t.dtypes.iter().map(|d| d.name().to_string()).collect(),
            auth: t.auth.iter().map(|a| a.name().to_string()).collect(),
            max_priority: t.max_priority.name().to_string(),
            job_ids: [t.job_ids.0, t.job_ids.1],
            lease_secs: t.lease.as_secs(),
            pool_slots: t.pool_slots,
            upstream: t.upstream.as_ref().map(|u| {
                let spines: Vec<String> = u.spines.iter().map(|s| s.to_string()).collect();
                format!(
                    "leaf {} of {}, spines {}",
                    u.leaf_index,
                    u.n_leaves,
                    spines.join(",")
                )
            }),
        }
    }
}

/// One line for `switchd check-config`: the tenant, its sources, quotas,
/// ids and lease.
pub fn describe(t: &TenantConfig) -> String {
    let r = TenantRow::new(t, None);
    format!(
        "{}: from {}, up to {} jobs of {} workers, pool {}, dtypes {}, auth {}, priority up \
         to {}, job ids {}-{}, lease {} s, {} slots{}",
        r.name,
        r.allowed_sources.join(","),
        r.max_jobs,
        r.max_workers_per_job,
        human_bytes(r.max_pool_bytes),
        r.dtypes.join(","),
        r.auth.join(","),
        r.max_priority,
        r.job_ids[0],
        r.job_ids[1],
        r.lease_secs,
        r.pool_slots,
        r.upstream.map_or_else(String::new, |u| format!(", {u}"))
    )
}

/// `switchctl tenant list`: a header and one line per tenant (name,
/// prefixes, jobs used/max, pool used/max, dtypes, auth, max priority, job
/// ids, lease), then a line per leaf tenant's upstream.
pub fn table(rows: &[TenantRow]) -> Vec<String> {
    let line = |c: [&str; 9]| {
        format!(
            "{:<16} {:<20} {:>7} {:>21} {:<12} {:<8} {:<8} {:>11} {:>6}",
            c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7], c[8]
        )
    };
    let mut out = vec![line([
        "tenant", "sources", "jobs", "pool", "dtypes", "auth", "priority", "job ids", "lease",
    ])
    .trim_end()
    .to_string()];
    for r in rows {
        out.push(
            line([
                &r.name,
                &r.allowed_sources.join(","),
                &format!("{}/{}", r.jobs, r.max_jobs),
                &format!(
                    "{}/{}",
                    human_bytes(r.pool_bytes),
                    human_bytes(r.max_pool_bytes)
                ),
                &r.dtypes.join(","),
                &r.auth.join(","),
                &format!("≤{}", r.max_priority),
                &format!("{}-{}", r.job_ids[0], r.job_ids[1]),
                &format!("{}s", r.lease_secs),
            ])
            .trim_end()
            .to_string(),
        );
        if let Some(u) = &r.upstream {
            out.push(format!("  {u}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proto::provision::TenantName;
    use proto::switch::Priority;
    use proto::tag::AuthMode;
    use proto::wire::Dtype;

    fn tenant() -> TenantConfig {
        TenantConfig {
            name: TenantName::new("team-a").unwrap(),
            key: [0x5a; 32],
            allowed_sources: vec![Ipv4Prefix {
                addr: [198, 18, 0, 0],
                len: 24,
            }],
            max_jobs: 4,
            max_workers_per_job: 64,
            max_pool_bytes: 1 << 30,
            dtypes: vec![Dtype::F32, Dtype::Bf16],
            auth: vec![AuthMode::Port],
            max_priority: Priority::High,
            job_ids: (32768, 65535),
            lease: std::time::Duration::from_secs(60),
            pool_slots: 256,
            upstream: None,
        }
    }

    #[test]
    fn a_row_shows_the_declaration_and_the_usage_and_never_the_key() {
        let r = TenantRow::new(&tenant(), Some((2, 3 << 20)));
        assert_eq!(r.allowed_sources, ["198.18.0.0/24"]);
        assert_eq!((r.jobs, r.max_jobs, r.pool_bytes), (2, 4, 3 << 20));
        assert_eq!(r.dtypes, ["f32", "bf16"]);
        assert_eq!(
            (r.auth.as_slice(), r.max_priority.as_str()),
            (&["port".to_string()][..], "high")
        );
        let json = serde_json::to_string(&r).unwrap();
        assert!(!json.contains("key") && !json.contains("5a5a"), "{json}");
        let back: TenantRow = serde_json::from_str(&json).unwrap();
        assert_eq!(back, r);
        let t = table(&[r]);
        assert!(
            t[0].starts_with("tenant") && t[0].ends_with("lease"),
            "{t:?}"
        );
        for want in [
            "team-a",
            "198.18.0.0/24",
            "2/4",
            "3.0 MiB/1.0 GiB",
            "f32,bf16",
            "≤high",
            "32768-65535",
            "60s",
        ] {
            assert!(t[1].contains(want), "{want}: {}", t[1]);
        }
        let d = describe(&tenant());
        assert!(
            d.starts_with("team-a: from 198.18.0.0/24, up to 4 jobs of 64 workers"),
            "{d}"
        );
    }
}
