//! What the leader does next, decided from what the Secret and the webhook configurations
//! hold and the time: no I/O and no clock here, so that every step of a rotation is tested
//! with injected times.
//!
//! The Secret is the whole state, so that a new leader picks up where the last one left
//! off:
//!
//! - `ca.crt`: the CA bundle the webhook configurations must carry (one CA, or two while a
//!   rotation is under way);
//! - `ca.key`: the key of the signing CA, the one certificate of the bundle it belongs to;
//! - `tls.crt`, `tls.key`: the serving certificate every replica serves;
//! - the annotations [`CA_ADDED_AT`] (when the signing CA entered the bundle) and
//!   [`SERVING_ISSUED_AT`] (when the serving certificate was issued).
//!
//! A CA rotation is three writes of the Secret, each safe at any moment:
//!
//! 1. a new CA joins the bundle and signs from now on ([`Why::NewCa`]); the serving
//!    certificate stays, so replicas serve a certificate of the old CA, which the bundle
//!    still holds; the webhook configurations get the bundle of both;
//! 2. once the new CA has been in the bundle for the overlap and both webhook
//!    configurations carry it, a serving certificate of the new CA ([`Why::CaSwitch`]):
//!    the apiserver trusts it before any replica serves it;
//! 3. once that certificate has been out for the overlap (every replica has swapped it in),
//!    the old CA leaves the bundle ([`Why::DropOldCa`]).
//!
//! A serving certificate due for renewal under the same CA is one write: the bundle does
//! not change.

use std::time::Duration;

use time::OffsetDateTime;

use crate::certs::{self, Ca, CertError, CertInfo};

/// When the signing CA entered the bundle, RFC 3339.
pub const CA_ADDED_AT: &str = "tollgate.dev/ca-added-at";
/// When the serving certificate was issued, RFC 3339.
pub const SERVING_ISSUED_AT: &str = "tollgate.dev/serving-issued-at";

/// Validities and margins (`serve --cert-validity` and the others).
#[derive(Debug, Clone)]
pub struct Timing {
    pub cert_validity: Duration,
    /// Renew the serving certificate this long before it expires.
    pub cert_renew_before: Duration,
    pub ca_validity: Duration,
    /// Renew the CA this long before it expires.
    pub ca_renew_before: Duration,
    /// How long a new CA is trusted before a certificate of it is served, and an old one
    /// after the last certificate of it was replaced.
    pub overlap: Duration,
}

impl Timing {
    /// The defaults: a serving certificate of a year and a CA of ten, each renewed a third
    /// of its life before it expires, a CA overlap of an hour.
    pub fn new(cert_validity: Duration, ca_validity: Duration, overlap: Duration) -> Timing {
        Timing {
            cert_validity,
            cert_renew_before: cert_validity / 3,
            ca_validity,
            ca_renew_before: ca_validity / 3,
            overlap,
        }
    }
}

/// What a Secret holds, as the leader reads it (byte strings of its `data`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stored {
    pub ca_crt: Option<Vec<u8>>,
    pub ca_key: Option<Vec<u8>>,
    pub tls_crt: Option<Vec<u8>>,
    pub tls_key: Option<Vec<u8>>,
    /// [`CA_ADDED_AT`] and [`SERVING_ISSUED_AT`], Unix milliseconds.
    pub ca_added_at: Option<i64>,
    pub serving_issued_at: Option<i64>,
}

/// What the Secret is to hold after a step. Every field is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contents {
    pub ca_crt: String,
    pub ca_key: String,
    pub tls_crt: Vec<u8>,
    pub tls_key: Vec<u8>,
    pub ca_added_at: i64,
    pub serving_issued_at: i64,
}

/// Why the Secret is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    /// There was none: a CA and a serving certificate.
    Created,
    /// The signing CA is due for renewal, expired, or missing (its key is not in the
    /// Secret): a new CA joins the bundle.
    NewCa,
    /// The new CA is trusted everywhere: a serving certificate of it.
    CaSwitch,
    /// The serving certificate is due for renewal (same CA).
    Renewal,
    /// The serving certificate is missing, expired or does not match its key.
    Repair,
    /// The old CA's overlap is over (or a CA of the bundle expired): it leaves.
    DropOldCa,
}

impl Why {
    pub fn as_str(self) -> &'static str {
        match self {
            Why::Created => "created",
            Why::NewCa => "new CA",
            Why::CaSwitch => "serving certificate of the new CA",
            Why::Renewal => "renewal",
            Why::Repair => "repair",
            Why::DropOldCa => "old CA dropped",
        }
    }

    /// Whether the step issues a CA, a serving certificate, or both: what
    /// `tollgate_certificate_rotations_total` counts.
    pub fn issues(self) -> (bool, bool) {
        match self {
            Why::Created => (true, true),
            Why::NewCa => (true, false),
            Why::CaSwitch | Why::Renewal | Why::Repair => (false, true),
            Why::DropOldCa => (false, false),
        }
    }
}

/// The leader's next step.
#[derive(Debug)]
pub enum Step {
    /// Create the Secret. The webhook configurations get its bundle first.
    Create(Contents),
    /// Replace the Secret's content.
    Update(Contents, Why),
    /// Nothing to do before this time (Unix milliseconds), unless something changes.
    Wait(i64),
}

/// What the webhook configurations trust now: the CA bundle of each webhook of each
/// configuration that exists (an absent configuration trusts nothing and needs nothing).
#[derive(Debug, Clone, Default)]
pub struct Trusted {
    pub bundles: Vec<Vec<u8>>,
}

impl Trusted {
    /// Whether every webhook trusts `ca` (DER).
    fn all_trust(&self, ca: &[u8]) -> bool {
        self.bundles.iter().all(|b| {
            std::str::from_utf8(b)
                .ok()
                .and_then(|t| CertInfo::parse_all(t).ok())
                .is_some_and(|cs| cs.iter().any(|c| c.der == ca))
        })
    }

    /// The CA certificates the webhooks trust now, without repeats.
    fn cas(&self) -> Vec<CertInfo> {
        let mut out: Vec<CertInfo> = vec![];
        for b in &self.bundles {
            let Some(cs) = std::str::from_utf8(b)
                .ok()
                .and_then(|t| CertInfo::parse_all(t).ok())
            else {
                continue;
            };
            for c in cs {
                if !out.iter().any(|o| o.der == c.der) {
                    out.push(c);
                }
            }
        }
        out
    }
}

/// The Secret as understood: which CA signs, whether the serving certificate is good.
struct Read {
    bundle: Vec<CertInfo>,
    /// The CA whose key the Secret holds, and that key.
    signing: Option<(CertInfo, String)>,
    /// The serving certificate, when it parses and matches its key.
    serving: Option<CertInfo>,
}

fn read(s: &Stored) -> Read {
    fn text(b: &Option<Vec<u8>>) -> Option<&str> {
        b.as_deref().and_then(|b| std::str::from_utf8(b).ok())
    }
    let bundle = text(&s.ca_crt)
        .and_then(|t| CertInfo::parse_all(t).ok())
        .unwrap_or_default();
    let signing = text(&s.ca_key).and_then(|key| {
        bundle
            .iter()
            .find(|c| c.is_ca && certs::key_matches(&c.der, key))
            .map(|c| (c.clone(), key.to_owned()))
    });
    let serving = match (text(&s.tls_crt), text(&s.tls_key)) {
        (Some(crt), Some(key)) => CertInfo::parse_pem(crt)
            .ok()
            .filter(|c| certs::key_matches(&c.der, key)),
        _ => None,
    };
    Read {
        bundle,
        signing,
        serving,
    }
}

fn ms(secs: i64) -> i64 {
    secs.saturating_mul(1000)
}

fn dur_ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn time_of(now_ms: i64) -> OffsetDateTime {
    OffsetDateTime::from_unix_timestamp_nanos(i128::from(now_ms) * 1_000_000)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH)
}

fn bundle_pem(cas: &[CertInfo]) -> String {
    cas.iter().map(CertInfo::pem).collect()
}

/// When the Secret's certificates are due for renewal (Unix milliseconds): the serving
/// certificate's renewal or the signing CA's, whichever comes first. Every replica exports
/// it, so that an alert sees a renewal the leader missed even with no leader.
pub fn renewal_due(s: &Stored, t: &Timing) -> Option<i64> {
    let r = read(s);
    let serving = r
        .serving
        .map(|c| ms(c.not_after) - dur_ms(t.cert_renew_before));
    let ca = r
        .signing
        .map(|(c, _)| ms(c.not_after) - dur_ms(t.ca_renew_before));
    match (serving, ca) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The next step, at `now` (Unix milliseconds), for a Secret (None: absent) and what the
/// webhook configurations trust.
pub fn next(
    now: i64,
    secret: Option<&Stored>,
    trusted: &Trusted,
    t: &Timing,
    names: &[String],
) -> Result<Step, CertError> {
    let at = time_of(now);
    let Some(s) = secret else {
        // The CAs the webhooks trust now stay trusted for the overlap: the replicas may be
        // serving a certificate of one of them (a Secret deleted by hand, a move from
        // `tollgate register` or cert-manager).
        let mut bundle: Vec<CertInfo> = trusted
            .cas()
            .into_iter()
            .filter(|c| c.is_ca && ms(c.not_after) > now)
            .collect();
        let ca = certs::new_ca(t.ca_validity, at)?;
        let (crt, key) = certs::sign_serving(&ca, names, t.cert_validity, at)?;
        bundle.push(CertInfo::parse_pem(&ca.cert_pem)?);
        return Ok(Step::Create(Contents {
            ca_crt: bundle_pem(&bundle),
            ca_key: ca.key_pem,
            tls_crt: crt.into_bytes(),
            tls_key: key.into_bytes(),
            ca_added_at: now,
            serving_issued_at: now,
        }));
    };
    let r = read(s);
    let ca_added_at = s.ca_added_at.unwrap_or(0);
    let issued_at = s.serving_issued_at.unwrap_or(0);
    let serving_ok = r.serving.as_ref().filter(|c| ms(c.not_after) > now);
    let keep_serving = || {
        (
            s.tls_crt.clone().unwrap_or_default(),
            s.tls_key.clone().unwrap_or_default(),
        )
    };

    // 1. A signing CA that is present and not due.
    let signing = r
        .signing
        .as_ref()
        .filter(|(c, _)| ms(c.not_after) - dur_ms(t.ca_renew_before) > now);
    let Some((ca_cert, ca_key)) = signing else {
        let ca = certs::new_ca(t.ca_validity, at)?;
        let mut bundle: Vec<CertInfo> = r
            .bundle
            .iter()
            .filter(|c| c.is_ca && ms(c.not_after) > now)
            .cloned()
            .collect();
        bundle.push(CertInfo::parse_pem(&ca.cert_pem)?);
        // A Secret with no usable serving certificate has nothing to keep serving: the
        // new CA signs one at once.
        let (tls_crt, tls_key, issued) = match serving_ok {
            Some(_) => {
                let (c, k) = keep_serving();
                (c, k, issued_at)
            }
            None => {
                let (c, k) = certs::sign_serving(&ca, names, t.cert_validity, at)?;
                (c.into_bytes(), k.into_bytes(), now)
            }
        };
        return Ok(Step::Update(
            Contents {
                ca_crt: bundle_pem(&bundle),
                ca_key: ca.key_pem,
                tls_crt,
                tls_key,
                ca_added_at: now,
                serving_issued_at: issued,
            },
            Why::NewCa,
        ));
    };
    let ca = Ca {
        cert_pem: ca_cert.pem(),
        key_pem: ca_key.clone(),
    };
    let mut wake = ms(ca_cert.not_after) - dur_ms(t.ca_renew_before);

    // 2. The serving certificate.
    let of_signing = serving_ok.filter(|c| certs::signed_by(&c.der, &ca_cert.der));
    let reissue = match (serving_ok, of_signing) {
        (None, _) => Some(Why::Repair),
        (Some(_), None) => {
            let trusted_since = ca_added_at + dur_ms(t.overlap);
            if now >= trusted_since && trusted.all_trust(&ca_cert.der) {
                Some(Why::CaSwitch)
            } else {
                // Until then: the bundle's repair makes the webhooks trust it, whose event
                // wakes the leader; the time does the rest.
                wake = wake.min(trusted_since.max(now + 1));
                None
            }
        }
        (Some(c), Some(_)) => {
            let due = ms(c.not_after) - dur_ms(t.cert_renew_before);
            if now >= due {
                Some(Why::Renewal)
            } else {
                wake = wake.min(due);
                None
            }
        }
    };
    let base = Contents {
        ca_crt: bundle_pem(&r.bundle),
        ca_key: ca_key.clone(),
        tls_crt: s.tls_crt.clone().unwrap_or_default(),
        tls_key: s.tls_key.clone().unwrap_or_default(),
        ca_added_at,
        serving_issued_at: issued_at,
    };
    if let Some(why) = reissue {
        let (crt, key) = certs::sign_serving(&ca, names, t.cert_validity, at)?;
        return Ok(Step::Update(
            Contents {
                tls_crt: crt.into_bytes(),
                tls_key: key.into_bytes(),
                serving_issued_at: now,
                ..base
            },
            why,
        ));
    }

    // 3. CAs other than the signing one: kept for the overlap after the last certificate
    //    of theirs was replaced, and only while the serving certificate is the signing
    //    CA's (else the one it was signed by is still needed); expired ones go at once.
    let others: Vec<&CertInfo> = r.bundle.iter().filter(|c| c.der != ca_cert.der).collect();
    if !others.is_empty() {
        let over = issued_at + dur_ms(t.overlap);
        let expired = others.iter().any(|c| ms(c.not_after) <= now);
        if (of_signing.is_some() && now >= over) || expired {
            let keep: Vec<CertInfo> = r
                .bundle
                .iter()
                .filter(|c| {
                    c.der == ca_cert.der
                        || (of_signing.is_none() || now < over) && ms(c.not_after) > now
                })
                .cloned()
                .collect();
            return Ok(Step::Update(
                Contents {
                    ca_crt: bundle_pem(&keep),
                    ..base
                },
                Why::DropOldCa,
            ));
        }
        if of_signing.is_some() {
            wake = wake.min(over);
        }
        for c in others {
            wake = wake.min(ms(c.not_after));
        }
    }
    // The bundle as stored may differ from what it should hold in form only (a bundle
    // written by another tool, with comments or other blocks): written back clean.
    if s.ca_crt.as_deref() != Some(base.ca_crt.as_bytes()) && !r.bundle.is_empty() {
        return Ok(Step::Update(base, Why::DropOldCa));
    }
    Ok(Step::Wait(wake))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: i64 = 1000;

    fn timing() -> Timing {
        // Seconds, as the tests of the server use: a serving certificate of 30 s renewed
        // 10 s before its end, a CA of 90 s renewed 65 s before (at 25 s, after the first
        // renewal of the serving certificate), 5 s of overlap.
        let mut t = Timing::new(
            Duration::from_secs(30),
            Duration::from_secs(90),
            Duration::from_secs(5),
        );
        t.ca_renew_before = Duration::from_secs(65);
        t
    }

    fn names() -> Vec<String> {
        certs::service_names("tollgate", "tollgate-system")
    }

    fn stored(c: &Contents) -> Stored {
        Stored {
            ca_crt: Some(c.ca_crt.clone().into_bytes()),
            ca_key: Some(c.ca_key.clone().into_bytes()),
            tls_crt: Some(c.tls_crt.clone()),
            tls_key: Some(c.tls_key.clone()),
            ca_added_at: Some(c.ca_added_at),
            serving_issued_at: Some(c.serving_issued_at),
        }
    }

    fn trusting(c: &Contents) -> Trusted {
        Trusted {
            bundles: vec![c.ca_crt.clone().into_bytes(), c.ca_crt.clone().into_bytes()],
        }
    }

    fn cas(c: &Contents) -> Vec<Vec<u8>> {
        CertInfo::parse_all(&c.ca_crt)
            .unwrap()
            .into_iter()
            .map(|c| c.der)
            .collect()
    }

    fn issuer_of(c: &Contents) -> Vec<u8> {
        let leaf = CertInfo::parse_pem(std::str::from_utf8(&c.tls_crt).unwrap()).unwrap();
        cas(c)
            .into_iter()
            .find(|ca| certs::signed_by(&leaf.der, ca))
            .expect("the serving certificate's CA is in the bundle")
    }

    fn now() -> i64 {
        OffsetDateTime::now_utc().unix_timestamp() * S
    }

    #[test]
    fn a_whole_rotation_keeps_the_serving_certificates_ca_trusted_at_every_step() {
        let t = timing();
        let t0 = now();
        let Step::Create(first) = next(t0, None, &Trusted::default(), &t, &names()).unwrap() else {
            panic!("an absent Secret is created")
        };
        assert_eq!(cas(&first).len(), 1);
        assert_eq!(issuer_of(&first), cas(&first)[0]);
        let mut current = first.clone();
        let mut trusted = trusting(&current);
        // Nothing to do until the serving certificate's renewal (30 s, less 10).
        let Step::Wait(w) = next(t0 + S, Some(&stored(&current)), &trusted, &t, &names()).unwrap()
        else {
            panic!("steady")
        };
        let leaf = CertInfo::parse_pem(std::str::from_utf8(&current.tls_crt).unwrap()).unwrap();
        assert_eq!(w, leaf.not_after * S - 10 * S);

        // The renewal: same CA, the bundle unchanged.
        let Step::Update(renewed, Why::Renewal) =
            next(w, Some(&stored(&current)), &trusted, &t, &names()).unwrap()
        else {
            panic!("renewal due")
        };
        assert_eq!(renewed.ca_crt, current.ca_crt);
        assert_ne!(renewed.tls_crt, current.tls_crt);
        current = renewed;

        // The CA's renewal is due at 25 s: a new CA joins; the serving certificate stays.
        let ca_due = CertInfo::parse_pem(&current.ca_crt).unwrap().not_after * S - 65 * S;
        let Step::Update(joined, Why::NewCa) =
            next(ca_due, Some(&stored(&current)), &trusted, &t, &names()).unwrap()
        else {
            panic!("CA due")
        };
        assert_eq!(cas(&joined).len(), 2, "old and new side by side");
        assert_eq!(joined.tls_crt, current.tls_crt);
        let old_ca = cas(&current)[0].clone();
        let new_ca = cas(&joined)[1].clone();
        assert_eq!(
            issuer_of(&joined),
            old_ca,
            "still served: a certificate of the old CA"
        );
        current = joined;

        // Within the overlap, or with webhooks not trusting the new CA yet: no switch.
        let soon = ca_due + S;
        assert!(matches!(
            next(soon, Some(&stored(&current)), &trusted, &t, &names()).unwrap(),
            Step::Wait(w) if w == ca_due + 5 * S
        ));
        let late = ca_due + 6 * S;
        assert!(matches!(
            next(late, Some(&stored(&current)), &trusted, &t, &names()).unwrap(),
            Step::Wait(_)
        ));
        // The webhooks repaired to the new bundle: now the switch.
        trusted = trusting(&current);
        let Step::Update(switched, Why::CaSwitch) =
            next(late, Some(&stored(&current)), &trusted, &t, &names()).unwrap()
        else {
            panic!("switch")
        };
        assert_eq!(issuer_of(&switched), new_ca);
        assert_eq!(cas(&switched).len(), 2, "the old CA stays for the overlap");
        current = switched;
        assert!(matches!(
            next(late + S, Some(&stored(&current)), &trusted, &t, &names()).unwrap(),
            Step::Wait(w) if w == late + 5 * S
        ));
        // The overlap over: the old CA leaves.
        let Step::Update(dropped, Why::DropOldCa) = next(
            late + 5 * S,
            Some(&stored(&current)),
            &trusted,
            &t,
            &names(),
        )
        .unwrap() else {
            panic!("drop")
        };
        assert_eq!(cas(&dropped), vec![new_ca.clone()]);
        assert_eq!(issuer_of(&dropped), new_ca);
        trusted = trusting(&dropped);
        assert!(matches!(
            next(
                late + 6 * S,
                Some(&stored(&dropped)),
                &trusted,
                &t,
                &names()
            )
            .unwrap(),
            Step::Wait(_)
        ));
    }

    #[test]
    fn a_secret_recreated_keeps_trusting_what_the_webhooks_trusted() {
        let t = timing();
        let t0 = now();
        let Step::Create(old) = next(t0, None, &Trusted::default(), &t, &names()).unwrap() else {
            panic!()
        };
        let Step::Create(new) = next(t0, None, &trusting(&old), &t, &names()).unwrap() else {
            panic!()
        };
        assert_eq!(cas(&new).len(), 2);
        assert_eq!(cas(&new)[0], cas(&old)[0]);
        assert_eq!(issuer_of(&new), cas(&new)[1]);
        // And it drops the old one after the overlap.
        let trusted = trusting(&new);
        assert!(matches!(
            next(t0 + 5 * S, Some(&stored(&new)), &trusted, &t, &names()).unwrap(),
            Step::Update(_, Why::DropOldCa)
        ));
    }

    #[test]
    fn a_secret_without_a_ca_key_or_certificate_is_taken_over() {
        let t = timing();
        let t0 = now();
        // A Secret of another tool: a CA and a serving certificate, no CA key.
        let Step::Create(foreign) = next(t0, None, &Trusted::default(), &t, &names()).unwrap()
        else {
            panic!()
        };
        let mut s = stored(&foreign);
        s.ca_key = None;
        s.ca_added_at = None;
        let Step::Update(c, Why::NewCa) =
            next(t0, Some(&s), &trusting(&foreign), &t, &names()).unwrap()
        else {
            panic!()
        };
        assert_eq!(cas(&c).len(), 2);
        assert_eq!(
            c.tls_crt, foreign.tls_crt,
            "the foreign certificate is still served"
        );
        // An empty Secret: a CA and a serving certificate at once.
        let Step::Update(c, Why::NewCa) = next(
            t0,
            Some(&Stored::default()),
            &Trusted::default(),
            &t,
            &names(),
        )
        .unwrap() else {
            panic!()
        };
        assert_eq!(issuer_of(&c), cas(&c)[0]);
        // A serving certificate whose key is not its own: reissued at once.
        let mut s = stored(&foreign);
        s.tls_key = Some(c.tls_key.clone());
        assert!(matches!(
            next(t0, Some(&s), &trusting(&foreign), &t, &names()).unwrap(),
            Step::Update(_, Why::Repair)
        ));
    }

    #[test]
    fn renewal_is_due_at_the_earlier_of_the_certificate_and_the_ca() {
        let t = timing();
        let t0 = now();
        let Step::Create(c) = next(t0, None, &Trusted::default(), &t, &names()).unwrap() else {
            panic!()
        };
        let leaf = CertInfo::parse_pem(std::str::from_utf8(&c.tls_crt).unwrap()).unwrap();
        assert_eq!(
            renewal_due(&stored(&c), &t),
            Some(leaf.not_after * S - 10 * S)
        );
        assert_eq!(renewal_due(&Stored::default(), &t), None);
    }
}
