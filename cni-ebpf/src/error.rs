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
    #[error("netlink: {context}: {source}")]
    Netlink {
        /// What we were doing.
        context: String,
        /// The kernel's or the library's error, kept typed (errno decisions read it).
        #[source]
        source: Box<Cause>,
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
    #[error("eBPF datapath: {context}: {source}")]
    Datapath {
        /// What we were doing.
        context: String,
        /// The error (aya's, with the verifier log when there is one), kept typed.
        #[source]
        source: Box<Cause>,
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

/// The underlying failure of a [`Error::Netlink`] or [`Error::Datapath`]: the library's
/// own error where there is one (so its errno and sources stay readable, and the spec's
/// `details` are filled from them), or a message where the failure is ours.
#[derive(Debug, thiserror::Error)]
pub enum Cause {
    /// A condition we detected ourselves.
    #[error("{0}")]
    Message(String),
    /// rtnetlink (the kernel's netlink answer, with its errno).
    #[error(transparent)]
    Netlink(#[from] rtnetlink::Error),
    /// An aya program operation (load with the verifier log, attach, query).
    #[error("{}", program_text(.0))]
    Program(#[source] aya::programs::ProgramError),
    /// An aya object load.
    #[error(transparent)]
    Ebpf(#[from] aya::EbpfError),
    /// An aya map operation.
    #[error(transparent)]
    Map(#[from] aya::maps::MapError),
    /// Pinning an aya object.
    #[error(transparent)]
    Pin(#[from] aya::pin::PinError),
    /// An aya link operation.
    #[error(transparent)]
    Link(#[from] aya::programs::links::LinkError),
    /// A system call.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<aya::programs::ProgramError> for Cause {
    fn from(e: aya::programs::ProgramError) -> Self {
        Self::Program(e)
    }
}

/// A program error as an operator needs it: a failed load shows the verifier's log, any
/// other error its chain of sources.
pub(crate) fn program_text(e: &aya::programs::ProgramError) -> String {
    match e {
        aya::programs::ProgramError::LoadError {
            io_error,
            verifier_log,
        } => format!("BPF_PROG_LOAD failed: {io_error}; verifier log:\n{verifier_log}"),
        other => chain(other),
    }
}

/// An error and its sources on one line, `: `-separated; a source whose text a wrapper
/// already shows is not repeated. Bounded, against a cyclic chain.
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    for _ in 0..16 {
        let Some(inner) = src else { break };
        let t = inner.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = inner.source();
    }
    s
}

impl Cause {
    /// The errno of the failure, where it carries one.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Netlink(rtnetlink::Error::NetlinkError(m)) => m.code.map(|c| c.get().abs()),
            Self::Io(e) => e.raw_os_error(),
            // aya's errors carry the system call's `io::Error` as (a source of) their
            // source.
            _ => {
                let mut next = std::error::Error::source(self);
                for _ in 0..8 {
                    let e = next?;
                    if let Some(io) = e.downcast_ref::<io::Error>() {
                        return io.raw_os_error();
                    }
                    next = e.source();
                }
                None
            }
        }
    }
}

impl From<String> for Cause {
    fn from(s: String) -> Self {
        Self::Message(s)
    }
}

impl From<&str> for Cause {
    fn from(s: &str) -> Self {
        Self::Message(s.to_owned())
    }
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

    /// The errno behind this error, where it has one (a system call's, the kernel's
    /// netlink answer's): decisions are made on it, never on the text.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Io { source, .. } => source.raw_os_error(),
            Self::Netlink { source, .. } | Self::Datapath { source, .. } => source.errno(),
            _ => None,
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
    pub fn netlink(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        Self::Netlink {
            context: context.into(),
            source: Box::new(source.into()),
        }
    }

    /// Shorthand for [`Error::Datapath`].
    pub fn datapath(context: impl Into<String>, source: impl Into<Cause>) -> Self {
        Self::Datapath {
            context: context.into(),
            source: Box::new(source.into()),
        }
    }

    /// The spec's error object for this error.
    #[must_use]
    pub fn to_json(&self, cni_version: &str) -> serde_json::Value {
        let mut details = Vec::new();
        let mut source = std::error::Error::source(self);
        while let Some(s) = source {
            // A wrapper that shows its source already (a cause with the verifier log, a
            // chain) is not repeated.
            let text = s.to_string();
            if !details.last().is_some_and(|d: &String| d.contains(&text)) {
                details.push(text);
            }
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

#[cfg(test)]
mod tests {
    #![expect(clippy::panic, reason = "tests fail by panicking with a message")]

    use super::{Cause, Error};

    #[test]
    fn a_failure_keeps_its_source_typed_and_in_the_details() {
        let e = Error::netlink(
            "deleting link #7",
            std::io::Error::from_raw_os_error(libc::EBUSY),
        );
        match &e {
            Error::Netlink { source, .. } => assert_eq!(source.errno(), Some(libc::EBUSY)),
            other => panic!("{other:?}"),
        }
        let e = Error::datapath("attaching from_pod", aya::programs::ProgramError::NotLoaded);
        assert!(
            matches!(&e, Error::Datapath { source, .. } if matches!(**source, Cause::Program(_)))
        );
        let doc = e.to_json("1.0.0");
        let details = doc["details"].as_str().unwrap_or_default();
        assert!(details.contains("not loaded"), "{doc}");
        assert_eq!(
            details.matches("not loaded").count(),
            1,
            "a source is not repeated: {doc}"
        );
        let plain = Error::datapath("checking", "a message of ours");
        assert!(
            matches!(&plain, Error::Datapath { source, .. } if matches!(**source, Cause::Message(_)))
        );
    }
}
