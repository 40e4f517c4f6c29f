//! A hand-built switch side of provisioning for the tests of
//! [`super::Provisioner`] and of the session's provisioning, made only of
//! the spec's pieces (`crate::provision`, `crate::auth::NonceIssuer`, the
//! wire types): one tenant, a `max_jobs` quota, a name → job map; answers
//! an ask with a CHALLENGE, a claim with a PROVISIONED or a NACK.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::auth::NonceIssuer;
use crate::provision::{self, JobName, ProvisionClaim, TenantKey, TenantName};
use crate::wire::{
    ChallengePayload, Header, HeaderRepr, MsgType, NackPayload, NackReason, ProvisionPayload,
    ProvisionedPayload, Quota, CHALLENGE_PAYLOAD_LEN, HEADER_LEN, NACK_PAYLOAD_LEN,
    PROVISIONED_CREATED, PROVISIONED_PAYLOAD_LEN, PROVISION_ASK, PROVISION_MAC_OFFSET,
};

pub(crate) struct FakeSwitch {
    pub gen: u32,
    pub tenant: TenantName,
    pub key: TenantKey,
    pub max_jobs: usize,
    pub lease_secs: u32,
    pub issuer: NonceIssuer,
    /// name → (id, the claim's shape bytes 96..104).
    pub jobs: BTreeMap<String, (u16, [u8; 8])>,
    pub next_id: u16,
}

impl FakeSwitch {
    pub fn new(gen: u32, tenant: &str, key: TenantKey, now: Instant) -> FakeSwitch {
        FakeSwitch {
            gen,
            tenant: TenantName::new(tenant).unwrap(),
            key,
            max_jobs: 4,
            lease_secs: 60,
            issuer: NonceIssuer::new([9; 32], now, Duration::from_secs(10)),
            jobs: BTreeMap::new(),
            next_id: 32768,
        }
    }

    fn nack(hdr: &HeaderRepr, reason: NackReason, detail: u16, echo: [u8; 16]) -> Vec<u8> {
        let mut h = HeaderRepr::new(MsgType::Nack, hdr.job);
        h.rank = hdr.rank;
        let mut b = vec![0u8; HEADER_LEN + NACK_PAYLOAD_LEN];
        h.emit_to(&mut b).unwrap();
        let mut p = NackPayload::echoing(reason, echo);
        p.detail = detail;
        p.emit(&mut b[HEADER_LEN..]).unwrap();
        b
    }

    /// The answer to a PROVISION from `ip`:`port`.
    pub fn answer(&mut self, datagram: &[u8], ip: [u8; 4], port: u16, now: Instant) -> Vec<u8> {
        let h = Header::new_checked(datagram).unwrap();
        let r = HeaderRepr::parse(&h).unwrap();
        assert_eq!(r.msg_type, MsgType::Provision);
        let p = ProvisionPayload::parse(h.payload()).unwrap();
        if p.tenant != self.tenant.to_wire() {
            return Self::nack(&r, NackReason::UnknownTenant, 0, p.nonce);
        }
        if r.count == PROVISION_ASK {
            let nonce = self
                .issuer
                .issue_provision(now, &p.tenant, &p.job_name, ip, port);
            let mut hh = HeaderRepr::new(MsgType::Challenge, r.job);
            hh.rank = r.rank;
            hh.gen = self.gen;
            let mut b = vec![0u8; HEADER_LEN + CHALLENGE_PAYLOAD_LEN];
            hh.emit_to(&mut b).unwrap();
            ChallengePayload {
                hello_nonce: p.nonce,
                nonce,
                observed_ip: ip,
                observed_port: port,
                seq_lanes: 0,
            }
            .emit(&mut b[HEADER_LEN..])
            .unwrap();
            return b;
        }
        if r.gen != self.gen {
            return Self::nack(&r, NackReason::StaleGeneration, 0, p.nonce);
        }
        if self
            .issuer
            .verify_provision_tag(&p.nonce, &p.tenant, &p.job_name, ip, port)
            .is_none()
        {
            return Self::nack(&r, NackReason::StaleNonce, 0, p.nonce);
        }
        let claim = ProvisionClaim {
            job: r.job,
            gen: r.gen,
            ip,
            port,
        };
        let covered = &h.payload()[..PROVISION_MAC_OFFSET];
        if !provision::verify_provision(&self.key, &claim, covered, &p.mac) {
            return Self::nack(&r, NackReason::BadSecret, 0, p.nonce);
        }
        let name = JobName::from_wire(&p.job_name).unwrap();
        let shape: [u8; 8] = h.payload()[96..104].try_into().unwrap();
        let (id, created) = match self.jobs.get(name.as_str()) {
            Some(&(id, s)) if s == shape => (id, false),
            Some(_) => return Self::nack(&r, NackReason::ParametersDiffer, 0, p.nonce),
            None if self.jobs.len() >= self.max_jobs => {
                return Self::nack(
                    &r,
                    NackReason::QuotaExceeded,
                    Quota::MaxJobs as u16,
                    p.nonce,
                )
            }
            None => {
                let id = self.next_id;
                self.next_id += 1;
                self.jobs.insert(name.as_str().to_owned(), (id, shape));
                (id, true)
            }
        };
        let secret = provision::job_secret(&self.key, &self.tenant, &name);
        let mut hh = HeaderRepr::new(MsgType::Provisioned, id);
        hh.rank = r.rank;
        hh.gen = self.gen;
        let mut b = vec![0u8; HEADER_LEN + PROVISIONED_PAYLOAD_LEN];
        hh.emit_to(&mut b).unwrap();
        ProvisionedPayload {
            nonce: p.nonce,
            lease_secs: self.lease_secs,
            flags: if created { PROVISIONED_CREATED } else { 0 },
            tag: provision::provisioned_tag(&secret, id, self.gen, &p.nonce, self.lease_secs),
        }
        .emit(&mut b[HEADER_LEN..])
        .unwrap();
        b
    }
}
