//! Generating the certificates of an NBD TLS directory with rcgen: a CA,
//! a server certificate for the given names and a client certificate,
//! ECDSA P-256, valid for ten years, with the key usages
//! GnuTLS (libnbd) and qemu check.

use crate::error::NbdError;
use crate::tls::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

fn err(e: rcgen::Error) -> NbdError {
    NbdError::Tls(format!("generating certificates: {e}"))
}

/// Valid from January 1st of this year (in UTC: already past) for ten
/// years after that.
#[allow(clippy::cast_possible_truncation, reason = "years since 1970 fit i32")]
fn validity(p: &mut CertificateParams) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // 365.2425 days a year, two days back against the rounding: the
    // 1st of January of this year, or of last year on its first days.
    let year = 1970 + (secs.saturating_sub(2 * 86400) / 31_556_952) as i32;
    p.not_before = rcgen::date_time_ymd(year, 1, 1);
    p.not_after = rcgen::date_time_ymd(year + 10, 1, 1);
}

/// The leaf of `issuer`: a server (for `names`) or a client certificate.
fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    cn: &str,
    names: &[String],
    usage: ExtendedKeyUsagePurpose,
) -> Result<(String, String), NbdError> {
    let mut p = CertificateParams::new(names.to_vec()).map_err(err)?;
    validity(&mut p);
    p.distinguished_name.push(DnType::CommonName, cn);
    p.use_authority_key_identifier_extension = true;
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    p.extended_key_usages = vec![usage];
    let key = KeyPair::generate().map_err(err)?;
    let cert = p.signed_by(&key, issuer).map_err(err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// (file name, PEM) of each file of a new TLS directory.
pub(crate) fn generate(names: &[String]) -> Result<Vec<(&'static str, String)>, NbdError> {
    let mut p = CertificateParams::new(Vec::<String>::new()).map_err(err)?;
    validity(&mut p);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.distinguished_name
        .push(DnType::CommonName, "Cairn NBD CA");
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_key = KeyPair::generate().map_err(err)?;
    let ca = p.self_signed(&ca_key).map_err(err)?;
    let ca_key_pem = ca_key.serialize_pem();
    let issuer = Issuer::new(p, ca_key);
    let server = leaf(
        &issuer,
        "Cairn NBD server",
        names,
        ExtendedKeyUsagePurpose::ServerAuth,
    )?;
    let client = leaf(
        &issuer,
        "Cairn NBD client",
        &[],
        ExtendedKeyUsagePurpose::ClientAuth,
    )?;
    Ok(vec![
        (CA_CERT, ca.pem()),
        (CA_KEY, ca_key_pem),
        (SERVER_CERT, server.0),
        (SERVER_KEY, server.1),
        (CLIENT_CERT, client.0),
        (CLIENT_KEY, client.1),
    ])
}
