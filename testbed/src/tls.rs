//! Certificate authorities for the tests' TLS servers (rcgen): the stand-in API server's,
//! and the agents' `/flows` certificates. Each is generated fresh; nothing is trusted by
//! the machine.

use std::net::IpAddr;

/// A CA that issues server certificates.
pub struct Authority {
    cert: rcgen::Certificate,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

/// A server certificate and its key, PEM and DER.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: Vec<u8>,
    pub key_der: Vec<u8>,
}

fn fail(e: rcgen::Error) -> ! {
    panic!("generating certificates: {e}")
}

impl Authority {
    /// A new CA named `name`.
    #[must_use]
    pub fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| fail(e));
        let mut params =
            rcgen::CertificateParams::new(Vec::<String>::new()).unwrap_or_else(|e| fail(e));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap_or_else(|e| fail(e));
        Self {
            cert,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// The CA's certificate (PEM), what a client trusts.
    #[must_use]
    pub fn ca_pem(&self) -> String {
        self.cert.pem()
    }

    /// A server certificate for `names` (DNS) and `ips`, with common name `cn`.
    #[must_use]
    pub fn issue(&self, cn: &str, names: &[&str], ips: &[IpAddr]) -> Issued {
        let key = rcgen::KeyPair::generate().unwrap_or_else(|e| fail(e));
        let mut params = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )
        .unwrap_or_else(|e| fail(e));
        params
            .subject_alt_names
            .extend(ips.iter().map(|ip| rcgen::SanType::IpAddress(*ip)));
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        let cert = params
            .signed_by(&key, &self.issuer)
            .unwrap_or_else(|e| fail(e));
        Issued {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        }
    }
}
