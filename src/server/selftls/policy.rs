//! The self-managed certificates' lifetimes and renewal thresholds, and the checks that they
//! leave room for each step of a rotation.

/// Between every webhook configuration holding the next CA and serving a certificate from it:
/// the API server's webhook clients follow a changed configuration within about a second.
pub const SETTLE: i64 = 10;

/// Lifetimes and renewal thresholds, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    pub ca_lifetime: i64,
    pub ca_renew_before: i64,
    pub cert_lifetime: i64,
    pub cert_renew_before: i64,
    /// How long a CA that no longer signs stays in the bundle.
    pub overlap: i64,
}

/// Thresholds that leave no room for a step (in seconds; shown as the flags take them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error(
        "the serving certificate's renewal threshold ({}) must be positive and shorter than its lifetime ({})",
        go_duration(*renew_before),
        go_duration(*lifetime)
    )]
    Serving { renew_before: i64, lifetime: i64 },
    #[error(
        "the CA's renewal threshold ({}) must be shorter than its lifetime ({})",
        go_duration(*renew_before),
        go_duration(*lifetime)
    )]
    Ca { renew_before: i64, lifetime: i64 },
    #[error(
        "the CA's renewal threshold ({}) must be longer than the serving certificate's ({}) plus {SETTLE}s",
        go_duration(*ca_renew_before),
        go_duration(*cert_renew_before)
    )]
    CaBeforeServing {
        ca_renew_before: i64,
        cert_renew_before: i64,
    },
    #[error("the CA overlap must not be negative")]
    NegativeOverlap,
}

/// Seconds as a Go duration, the form the flags take: `8760h`, `1h30m`, `45s`, `0s`.
pub fn go_duration(seconds: i64) -> String {
    let (sign, s) = if seconds < 0 {
        ("-", -seconds)
    } else {
        ("", seconds)
    };
    let (h, m, s) = (s / 3600, s % 3600 / 60, s % 60);
    let mut out = String::from(sign);
    for (v, unit) in [(h, "h"), (m, "m"), (s, "s")] {
        if v > 0 {
            out.push_str(&format!("{v}{unit}"));
        }
    }
    if out.len() == sign.len() {
        out.push_str("0s");
    }
    out
}

impl Policy {
    /// Checks that the thresholds leave room for each step; returns the first problem.
    pub fn check(&self) -> Result<(), PolicyError> {
        if self.cert_renew_before <= 0 || self.cert_renew_before >= self.cert_lifetime {
            return Err(PolicyError::Serving {
                renew_before: self.cert_renew_before,
                lifetime: self.cert_lifetime,
            });
        }
        if self.ca_renew_before >= self.ca_lifetime {
            return Err(PolicyError::Ca {
                renew_before: self.ca_renew_before,
                lifetime: self.ca_lifetime,
            });
        }
        // The CA rotation must start while a serving certificate from the old CA still has
        // its whole renewal window ahead: one renewal, then the switch.
        if self.ca_renew_before <= self.cert_renew_before + SETTLE {
            return Err(PolicyError::CaBeforeServing {
                ca_renew_before: self.ca_renew_before,
                cert_renew_before: self.cert_renew_before,
            });
        }
        if self.overlap < 0 {
            return Err(PolicyError::NegativeOverlap);
        }
        Ok(())
    }
}
