//! Certificates and keys in PEM for rustls (ring as its provider): the API client's CA and
//! client certificate, the agent's `/flows` serving certificate, and the CA `observe`
//! checks an agent's certificate with.

use std::sync::Arc;

use rustls::{
    crypto::CryptoProvider,
    pki_types::{CertificateDer, PrivateKeyDer},
    ClientConfig, RootCertStore, ServerConfig,
};

/// rustls' ring provider.
#[must_use]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Every `CERTIFICATE` block of `pem`, in order. `Err`: not PEM, or none.
///
/// # Errors
/// Said in words, for the caller to name the file.
pub fn certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = pem::parse_many(pem)
        .map_err(|e| format!("not PEM: {e}"))?
        .into_iter()
        .filter(|p| p.tag() == "CERTIFICATE")
        .map(|p| p.into_contents().into())
        .collect();
    if certs.is_empty() {
        return Err("holds no CERTIFICATE".into());
    }
    Ok(certs)
}

/// The first private key of `pem` (PKCS #8, PKCS #1 or SEC1).
///
/// # Errors
/// Not PEM, or no private key in it.
pub fn private_key(pem: &[u8]) -> Result<PrivateKeyDer<'static>, String> {
    pem::parse_many(pem)
        .map_err(|e| format!("not PEM: {e}"))?
        .into_iter()
        .find_map(|p| match p.tag() {
            "PRIVATE KEY" => Some(PrivateKeyDer::Pkcs8(p.into_contents().into())),
            "RSA PRIVATE KEY" => Some(PrivateKeyDer::Pkcs1(p.into_contents().into())),
            "EC PRIVATE KEY" => Some(PrivateKeyDer::Sec1(p.into_contents().into())),
            _ => None,
        })
        .ok_or_else(|| "holds no private key".into())
}

/// The certificates of `pem` as the only roots trusted.
///
/// # Errors
/// Not PEM, none in it, or one rustls refuses.
pub fn roots(pem: &[u8]) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    for c in certificates(pem)? {
        roots
            .add(c)
            .map_err(|e| format!("a certificate rustls refuses: {e}"))?;
    }
    Ok(roots)
}

/// A client that trusts only the CA of `ca_pem`, presenting no certificate.
///
/// # Errors
/// As [`roots`].
pub fn client_trusting(ca_pem: &[u8]) -> Result<ClientConfig, String> {
    Ok(ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots(ca_pem)?)
        .with_no_client_auth())
}

/// A server presenting the chain of `cert_pem` with the key of `key_pem`, asking clients
/// for no certificate, speaking HTTP/1.1.
///
/// # Errors
/// Either does not parse, or the key does not go with the certificate.
pub fn server(cert_pem: &[u8], key_pem: &[u8]) -> Result<ServerConfig, String> {
    let chain = certificates(cert_pem).map_err(|e| format!("the certificate {e}"))?;
    let key = private_key(key_pem).map_err(|e| format!("the key {e}"))?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the certificate and key: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]

    use super::*;

    #[test]
    fn what_is_not_a_certificate_or_a_key_is_said_so() {
        assert_eq!(certificates(b"hello").unwrap_err(), "holds no CERTIFICATE");
        let key_only = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n";
        assert_eq!(certificates(key_only).unwrap_err(), "holds no CERTIFICATE");
        assert!(matches!(private_key(key_only), Ok(PrivateKeyDer::Pkcs8(_))));
        let cert_only = b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        assert_eq!(private_key(cert_only).unwrap_err(), "holds no private key");
        assert!(server(cert_only, key_only).is_err());
    }
}
