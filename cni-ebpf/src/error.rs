//! The one error type of the plugin and its mapping to CNI error codes.
//!
//! Every variant names what went wrong (the variable, the field, the value); `main` is the
//! only place that turns an [`Error`] into the spec's error JSON and an exit status.

use std::{io, path::PathBuf};

/// Result alias used throughout the plugin.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can make a CNI operation fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Code 1: the configuration asks for a spec version we do not speak, or a verb that
    /// version does not have.
    #[error("incompatible CNI version: {0}")]
    IncompatibleVersion(String),

    /// Code 2: a field we recognise but cannot honour.
    #[error("unsupported field `{field}` = {value}")]
    UnsupportedField {
        /// Field name (dotted path).
        field: String,
        /// The value as JSON.
        value: String,
    },

    /// Code 3: the container is unknown or does not exist.
    #[error("unknown container: {0}")]
    UnknownContainer(String),

    /// Code 4: a `CNI_*` environment variable is missing or malformed.
    #[error("invalid environment variable {name}: {reason}")]
    InvalidEnv {
        /// The variable, e.g. `CNI_IFNAME`.
        name: &'static str,
        /// Why it was refused.
        reason: String,
    },

    /// Code 5: an I/O operation failed.
    #[error("I/O failure: {context}: {source}")]
    Io {
        /// What we were doing.
        context: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// Code 6: stdin (or a stored document) is not valid JSON of the expected shape.
    #[error("failed to decode {what}: {reason}")]
    Decode {
        /// What was being decoded.
        what: String,
        /// The decoder's message.
        reason: String,
    },

    /// Code 7: the network configuration is well-formed JSON but not valid.
    #[error("invalid network config: `{field}`: {reason}")]
    InvalidConfig {
        /// Field name (dotted path), e.g. `ipam.ranges[0][0].subnet`.
        field: String,
        /// Why the value was refused.
        reason: String,
    },

    /// Code 11: a transient condition (lock contention); the runtime should retry.
    #[error("try again later: {0}")]
    TryAgain(String),

    /// Code 50 (STATUS): the plugin cannot serve ADDs now.
    #[error("plugin not available: {0}")]
    NotAvailable(String),

    /// Code 51 (STATUS): not available, and existing pods may have limited connectivity.
    #[error("plugin not available, existing pods may have limited connectivity: {0}")]
    LimitedConnectivity(String),

    /// Code 100: address management failed (exhausted range, requested address taken, …).
    #[error("IPAM: {0}")]
    Ipam(String),

    /// Code 101: a netlink request failed.
    #[error("netlink: {context}: {reason}")]
    Netlink {
        /// What we were doing.
        context: String,
        /// The kernel's or the library's message.
        reason: String,
    },

    /// Code 102: a network namespace could not be opened or entered.
    #[error("network namespace {path}: {reason}")]
    Netns {
        /// The namespace path.
        path: PathBuf,
        /// Why.
        reason: String,
    },

    /// Code 103: loading, pinning or attaching eBPF programs or maps failed.
    #[error("eBPF datapath: {context}: {reason}")]
    Datapath {
        /// What we were doing.
        context: String,
        /// The error, including the verifier log when there is one.
        reason: String,
    },

    /// Code 104: CHECK found live state that differs from what was set up.
    #[error("CHECK failed: {0}")]
    Check(String),

    /// Code 105: the interface asked for already exists in the container.
    #[error("interface {ifname} already exists in {netns}")]
    InterfaceExists {
        /// `CNI_IFNAME`.
        ifname: String,
        /// `CNI_NETNS`.
        netns: String,
    },

    /// A delegated plugin (IPAM) failed; its own code and message are passed on.
    #[error("delegated plugin {plugin} failed: {msg}")]
    Delegate {
        /// The plugin type.
        plugin: String,
        /// Its error code.
        code: u32,
        /// Its message (and details).
        msg: String,
    },

    /// Several independent failures (best-effort DEL / GC); the code is the first one's.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Multiple(Vec<Error>),
}

impl Error {
    /// The CNI error code of this error.
    #[must_use]
    pub fn code(&self) -> u32 {
        match self {
            Self::IncompatibleVersion(_) => 1,
            Self::UnsupportedField { .. } => 2,
            Self::UnknownContainer(_) => 3,
            Self::InvalidEnv { .. } => 4,
            Self::Io { .. } => 5,
            Self::Decode { .. } => 6,
            Self::InvalidConfig { .. } => 7,
            Self::TryAgain(_) => 11,
            Self::NotAvailable(_) => 50,
            Self::LimitedConnectivity(_) => 51,
            Self::Ipam(_) => 100,
            Self::Netlink { .. } => 101,
            Self::Netns { .. } => 102,
            Self::Datapath { .. } => 103,
            Self::Check(_) => 104,
            Self::InterfaceExists { .. } => 105,
            Self::Delegate { code, .. } => *code,
            Self::Multiple(errors) => errors.first().map_or(999, Self::code),
        }
    }

    /// The short, fixed description of the code (the `msg` of the spec's error object is the
    /// full message; this is used as a prefix in logs).
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self.code() {
            1 => "Incompatible CNI version",
            2 => "Unsupported field in network configuration",
            3 => "Container unknown or does not exist",
            4 => "Invalid necessary environment variables",
            5 => "I/O failure",
            6 => "Failed to decode content",
            7 => "Invalid network config",
            11 => "Try again later",
            50 => "The plugin is not available",
            51 => "The plugin is not available; existing containers may have limited connectivity",
            _ => "cni-ebpf error",
        }
    }

    /// `Ok` for no errors, the error itself for one, [`Error::Multiple`] for several
    /// (best-effort operations collect their failures and report them all).
    pub fn from_list(mut errors: Vec<Self>) -> Result<()> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Self::Multiple(errors)),
        }
    }

    /// Shorthand for [`Error::InvalidConfig`].
    pub fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::InvalidEnv`].
    pub fn env(name: &'static str, reason: impl Into<String>) -> Self {
        Self::InvalidEnv {
            name,
            reason: reason.into(),
        }
    }

    /// Shorthand for [`Error::Io`].
    pub fn io(context: impl Into<String>, source: io::Error) -> Self {
        Self::Io {
            context: context.into(),
            source,
        }
    }

    /// Shorthand for [`Error::Netlink`].
    pub fn netlink(context: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Self::Netlink {
            context: context.into(),
            reason: reason.to_string(),
        }
    }

    /// Shorthand for [`Error::Datapath`].
    pub fn datapath(context: impl Into<String>, reason: impl std::fmt::Display) -> Self {
        Self::Datapath {
            context: context.into(),
            reason: reason.to_string(),
        }
    }

    /// The spec's error object for this error.
    #[must_use]
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut details = Vec::new();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            details.push(s.to_string());
            source = s.source();
        }
        let mut obj = serde_json::json!({
            "cniVersion": cni_version,
            "code": self.code(),
            "msg": self.to_string(),
        });
        if !details.is_empty() {
            obj["details"] = serde_json::Value::String(details.join(": "));
        }
        obj
    }
}
