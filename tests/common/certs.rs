//! Test certificates, made fresh per test with rcgen: a CA, server certificates for
//! `localhost`/127.0.0.1 (or any names), and client certificates whose CN is a user name.
//!
//! Files are written PEM into a directory the caller owns; keys get mode 0600 (PostgreSQL refuses
//! a group- or world-readable server key).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};

/// A certificate authority that signs leaf certificates.
pub struct TestCa {
    cert: Certificate,
    key: KeyPair,
    pub cert_pem: String,
}

/// A leaf certificate and its key, written to disk.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    pub fn new(name: &str) -> TestCa {
        let key = KeyPair::generate().expect("CA key");
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let cert = p.self_signed(&key).expect("self-signed CA");
        let cert_pem = cert.pem();
        TestCa { cert, key, cert_pem }
    }

    /// Write the CA certificate as `<dir>/<file>`.
    pub fn write_ca(&self, dir: &Path, file: &str) -> PathBuf {
        let path = dir.join(file);
        fs::write(&path, &self.cert_pem).expect("write CA");
        path
    }

    /// A server certificate for `dns` names and 127.0.0.1, as `<dir>/<stem>.crt` and `.key`.
    pub fn server(&self, dir: &Path, stem: &str, dns: &[&str]) -> CertFiles {
        let mut p = CertificateParams::new(dns.iter().map(|s| s.to_string()).collect::<Vec<_>>()).expect("params");
        p.subject_alt_names.push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        p.distinguished_name.push(DnType::CommonName, dns.first().copied().unwrap_or("localhost"));
        p.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
        self.leaf(dir, stem, p)
    }

    /// A server certificate whose only name is `name` (no IP address): for hostname-mismatch tests.
    pub fn server_named_only(&self, dir: &Path, stem: &str, name: &str) -> CertFiles {
        let mut p = CertificateParams::new(vec![name.to_string()]).expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
        self.leaf(dir, stem, p)
    }

    /// A client certificate with CN = `user` (PostgreSQL's `cert` auth maps CN to the role).
    pub fn client(&self, dir: &Path, stem: &str, user: &str) -> CertFiles {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, user);
        p.extended_key_usages.push(ExtendedKeyUsagePurpose::ClientAuth);
        self.leaf(dir, stem, p)
    }

    fn leaf(&self, dir: &Path, stem: &str, p: CertificateParams) -> CertFiles {
        let key = KeyPair::generate().expect("leaf key");
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("sign leaf");
        let files = CertFiles { cert: dir.join(format!("{stem}.crt")), key: dir.join(format!("{stem}.key")) };
        fs::write(&files.cert, cert.pem()).expect("write cert");
        fs::write(&files.key, key.serialize_pem()).expect("write key");
        fs::set_permissions(&files.key, fs::Permissions::from_mode(0o600)).expect("chmod key");
        files
    }
}
