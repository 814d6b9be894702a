//! Where the API client's server address, CA and credentials come from: the pod's
//! ServiceAccount (the in-cluster default), or a kubeconfig file (`--kubeconfig`, for an
//! agent run outside a pod, e.g. by systemd on a node, or `install` run by hand).
//!
//! From a kubeconfig, the current context's cluster and user are read (kube's own
//! `Kubeconfig` parser): `server`, `certificate-authority` or `certificate-authority-data`,
//! and a bearer `token` or `tokenFile`, or a client certificate and key (files or `-data`).
//! `exec` and `auth-provider` users run programs or talk to identity providers, which the
//! agent does not: such a kubeconfig is refused, naming the user.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use kube::config::Kubeconfig;
use secrecy::ExposeSecret as _;

use super::{server_url, ApiArgs, ApiError};

/// How requests prove who sends them.
#[derive(Debug, Clone)]
pub enum Auth {
    /// `Authorization: Bearer`: the token as read now, and the file it is read from again
    /// for every request (a rotated token is followed); no file: a fixed token.
    Bearer {
        token: String,
        file: Option<PathBuf>,
    },
    /// A TLS client certificate chain and its key (PEM).
    ClientCert { chain: Vec<u8>, key: Vec<u8> },
}

/// What the client needs to reach the API server.
#[derive(Debug, Clone)]
pub struct Credentials {
    /// The API server's URL.
    pub server: String,
    /// The CA certificates (PEM) the server's certificate must chain to.
    pub ca_pem: Vec<u8>,
    /// Where `ca_pem` came from (for messages).
    pub ca_source: PathBuf,
    pub auth: Auth,
    /// The namespace of the client's default (the ServiceAccount's, the context's).
    pub namespace: Option<String>,
}

fn read_file(path: &Path) -> Result<Vec<u8>, ApiError> {
    std::fs::read(path).map_err(|source| ApiError::Credentials {
        path: path.to_owned(),
        source,
    })
}

/// The credentials `args` name: its kubeconfig, else the ServiceAccount's.
pub fn resolve(args: &ApiArgs) -> Result<Credentials, ApiError> {
    match &args.kubeconfig {
        Some(path) => from_kubeconfig(path, args.api_server.as_deref()),
        None => from_service_account(args),
    }
}

fn from_service_account(args: &ApiArgs) -> Result<Credentials, ApiError> {
    let server = server_url(args)?;
    let dir = &args.service_account_dir;
    let (token_file, ca) = (dir.join("token"), dir.join("ca.crt"));
    let token = String::from_utf8_lossy(&read_file(&token_file)?)
        .trim()
        .to_owned();
    Ok(Credentials {
        server,
        ca_pem: read_file(&ca)?,
        ca_source: ca,
        auth: Auth::Bearer {
            token,
            file: Some(token_file),
        },
        namespace: std::fs::read_to_string(dir.join("namespace"))
            .ok()
            .map(|n| n.trim().to_owned()),
    })
}

fn bad(path: &Path, reason: impl Into<String>) -> ApiError {
    ApiError::Kubeconfig {
        path: path.to_owned(),
        reason: reason.into(),
    }
}

/// A `-data` field's bytes (base64).
fn data(path: &Path, field: &str, value: &str) -> Result<Vec<u8>, ApiError> {
    base64::engine::general_purpose::STANDARD
        .decode(value.trim())
        .map_err(|e| bad(path, format!("{field} is not base64: {e}")))
}

/// A file a kubeconfig names, relative to the kubeconfig's directory as kubectl reads it.
fn relative(kubeconfig: &Path, file: &str) -> PathBuf {
    let f = Path::new(file);
    if f.is_absolute() {
        f.to_owned()
    } else {
        kubeconfig.parent().unwrap_or(Path::new(".")).join(f)
    }
}

fn from_kubeconfig(path: &Path, server_flag: Option<&str>) -> Result<Credentials, ApiError> {
    let kc = Kubeconfig::read_from(path).map_err(|e| bad(path, e.to_string()))?;
    let current = kc
        .current_context
        .clone()
        .ok_or_else(|| bad(path, "no current-context"))?;
    let context = kc
        .contexts
        .iter()
        .find(|c| c.name == current)
        .and_then(|c| c.context.clone())
        .ok_or_else(|| bad(path, format!("context {current:?} is not defined")))?;
    let (server, ca_pem, ca_source) = server_and_ca(path, &kc, &context.cluster, server_flag)?;
    let user_name = context.user.clone().unwrap_or_default();
    let auth = user_auth(path, &kc, &user_name)?;
    Ok(Credentials {
        server,
        ca_pem,
        ca_source,
        auth,
        namespace: context.namespace,
    })
}

/// The API server's address (`--api-server` over the kubeconfig's) and the CA that
/// verifies it, with where the CA was read, for the kubeconfig's `cluster`.
fn server_and_ca(
    path: &Path,
    kc: &Kubeconfig,
    cluster_name: &str,
    server_flag: Option<&str>,
) -> Result<(String, Vec<u8>, PathBuf), ApiError> {
    let cluster = kc
        .clusters
        .iter()
        .find(|c| c.name == cluster_name)
        .and_then(|c| c.cluster.clone())
        .ok_or_else(|| bad(path, format!("cluster {:?} is not defined", cluster_name)))?;
    let server = match server_flag.filter(|s| !s.is_empty()) {
        Some(s) => s.trim_end_matches('/').to_owned(),
        None => cluster
            .server
            .clone()
            .map(|s| s.trim_end_matches('/').to_owned())
            .ok_or_else(|| bad(path, format!("cluster {:?} has no server", cluster_name)))?,
    };
    if cluster.insecure_skip_tls_verify == Some(true) {
        return Err(bad(
            path,
            format!(
                "cluster {:?} sets insecure-skip-tls-verify: the agent verifies the API \
                 server; give its CA (certificate-authority-data)",
                cluster_name
            ),
        ));
    }
    let (ca_pem, ca_source) = match (
        &cluster.certificate_authority_data,
        &cluster.certificate_authority,
    ) {
        (Some(d), _) => (
            data(path, "certificate-authority-data", d)?,
            path.to_owned(),
        ),
        (None, Some(f)) => {
            let f = relative(path, f);
            (read_file(&f)?, f)
        }
        (None, None) => {
            return Err(bad(
                path,
                format!("cluster {:?} names no certificate authority", cluster_name),
            ))
        }
    };
    Ok((server, ca_pem, ca_source))
}

/// How the kubeconfig's user `user_name` authenticates: a token, a token file, or a client
/// certificate with its key (an exec plugin or auth provider is refused).
fn user_auth(path: &Path, kc: &Kubeconfig, user_name: &str) -> Result<Auth, ApiError> {
    let user = kc
        .auth_infos
        .iter()
        .find(|u| u.name == user_name)
        .and_then(|u| u.auth_info.clone())
        .ok_or_else(|| bad(path, format!("user {user_name:?} is not defined")))?;
    if user.exec.is_some() || user.auth_provider.is_some() {
        return Err(bad(
            path,
            format!(
                "user {user_name:?} authenticates with an exec plugin or auth provider, which \
                 the agent does not run: give it a token, tokenFile or client certificate"
            ),
        ));
    }
    let pem_of = |data_field: &Option<String>, file_field: &Option<String>, what: &str| match (
        data_field, file_field,
    ) {
        (Some(d), _) => data(path, &format!("{what}-data"), d).map(Some),
        (None, Some(f)) => read_file(&relative(path, f)).map(Some),
        (None, None) => Ok(None),
    };
    let chain = pem_of(
        &user.client_certificate_data,
        &user.client_certificate,
        "client-certificate",
    )?;
    let key_data = user
        .client_key_data
        .as_ref()
        .map(|k| k.expose_secret().to_owned());
    let key = pem_of(&key_data, &user.client_key, "client-key")?;
    let auth = match (
        user.token
            .as_ref()
            .map(|t| t.expose_secret().trim().to_owned()),
        user.token_file.as_deref(),
        chain,
        key,
    ) {
        (Some(token), _, _, _) => Auth::Bearer { token, file: None },
        (None, Some(f), _, _) => {
            let f = relative(path, f);
            Auth::Bearer {
                token: String::from_utf8_lossy(&read_file(&f)?).trim().to_owned(),
                file: Some(f),
            }
        }
        (None, None, Some(chain), Some(key)) => Auth::ClientCert { chain, key },
        _ => {
            return Err(bad(
                path,
                format!(
                    "user {user_name:?} has no token, tokenFile, or client certificate with \
                     its key"
                ),
            ))
        }
    };
    Ok(auth)
}

#[cfg(test)]
#[expect(clippy::unwrap_used, clippy::panic, reason = "tests")]
mod tests {
    use super::*;

    fn args(kubeconfig: PathBuf) -> ApiArgs {
        ApiArgs {
            api_server: None,
            service_account_dir: PathBuf::from("/nonexistent"),
            kubeconfig: Some(kubeconfig),
            api_timeout: 1,
            watch_timeout: super::super::DEFAULT_WATCH_TIMEOUT_SECS,
        }
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn a_kubeconfig_gives_the_current_contexts_server_ca_and_user() {
        let dir = tempfile::tempdir().unwrap();
        write(
            dir.path(),
            "ca.pem",
            "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n",
        );
        write(dir.path(), "token", "tok-from-file\n");
        let kc = write(
            dir.path(),
            "config",
            "apiVersion: v1\nkind: Config\ncurrent-context: node\n\
             clusters:\n- name: c\n  cluster:\n    server: https://10.0.0.1:6443/\n    certificate-authority: ca.pem\n\
             contexts:\n- name: node\n  context:\n    cluster: c\n    user: agent\n    namespace: kube-system\n\
             users:\n- name: agent\n  user:\n    tokenFile: token\n",
        );
        let c = resolve(&args(kc)).unwrap();
        assert_eq!(c.server, "https://10.0.0.1:6443");
        assert!(c.ca_pem.starts_with(b"-----BEGIN CERTIFICATE-----"));
        assert_eq!(c.namespace.as_deref(), Some("kube-system"));
        match c.auth {
            Auth::Bearer { token, file } => {
                assert_eq!(token, "tok-from-file");
                assert_eq!(file, Some(dir.path().join("token")));
            }
            Auth::ClientCert { .. } => panic!("expected a token"),
        }
    }

    #[test]
    fn a_client_certificate_user_and_refusals_name_what_is_wrong() {
        let dir = tempfile::tempdir().unwrap();
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let config = |user: &str| {
            format!(
                "apiVersion: v1\nkind: Config\ncurrent-context: x\n\
                 clusters:\n- name: c\n  cluster:\n    server: https://k:6443\n    certificate-authority-data: {}\n\
                 contexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n\
                 users:\n- name: u\n  user:\n{user}",
                b64("CA")
            )
        };
        let kc = write(
            dir.path(),
            "cert",
            &config(&format!(
                "    client-certificate-data: {}\n    client-key-data: {}\n",
                b64("CHAIN"),
                b64("KEY")
            )),
        );
        match resolve(&args(kc)).unwrap().auth {
            Auth::ClientCert { chain, key } => {
                assert_eq!((chain, key), (b"CHAIN".to_vec(), b"KEY".to_vec()))
            }
            Auth::Bearer { .. } => panic!("expected a client certificate"),
        }
        let kc = write(
            dir.path(),
            "exec",
            &config("    exec:\n      apiVersion: client.authentication.k8s.io/v1\n      command: aws\n"),
        );
        let e = resolve(&args(kc)).unwrap_err().to_string();
        assert!(e.contains("exec plugin") && e.contains("\"u\""), "{e}");
        let kc = write(dir.path(), "none", &config("    username: admin\n"));
        let e = resolve(&args(kc)).unwrap_err().to_string();
        assert!(e.contains("no token"), "{e}");
    }
}
