//! Spec versions we speak, and what each allows.

use crate::error::{Error, Result};

/// Every version this plugin accepts and can emit, oldest first.
pub const SUPPORTED: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];

/// The newest version we speak.
pub const LATEST: &str = "1.1.0";

/// A supported spec version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// 0.1.0
    V010,
    /// 0.2.0
    V020,
    /// 0.3.0
    V030,
    /// 0.3.1
    V031,
    /// 0.4.0
    V040,
    /// 1.0.0
    V100,
    /// 1.1.0
    V110,
}

impl Version {
    /// Every supported version, oldest first (the order of [`SUPPORTED`]).
    pub const ALL: [Self; 7] = [
        Self::V010,
        Self::V020,
        Self::V030,
        Self::V031,
        Self::V040,
        Self::V100,
        Self::V110,
    ];

    /// Parses a supported version string; anything else is error 1.
    pub fn parse(s: &str) -> Result<Self> {
        Ok(match s {
            "0.1.0" => Self::V010,
            "0.2.0" => Self::V020,
            "0.3.0" => Self::V030,
            "0.3.1" => Self::V031,
            "0.4.0" => Self::V040,
            "1.0.0" => Self::V100,
            "1.1.0" => Self::V110,
            other => {
                return Err(Error::IncompatibleVersion(format!(
                    "cniVersion {other:?} is not supported; supported versions: {}",
                    SUPPORTED.join(", ")
                )))
            }
        })
    }

    /// The version string.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V010 => "0.1.0",
            Self::V020 => "0.2.0",
            Self::V030 => "0.3.0",
            Self::V031 => "0.3.1",
            Self::V040 => "0.4.0",
            Self::V100 => "1.0.0",
            Self::V110 => "1.1.0",
        }
    }

    /// Whether results use the legacy `ip4`/`ip6` shape (before 0.3.0).
    #[must_use]
    pub fn is_legacy(self) -> bool {
        self < Self::V030
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_lists_every_supported_version_in_order() {
        let parsed: Vec<Version> = SUPPORTED
            .iter()
            .filter_map(|v| Version::parse(v).ok())
            .collect();
        assert_eq!(parsed, Version::ALL);
    }
}
