//! Which upstream `openvpn` the lab runs as the referee: its own module, below both the
//! upstream processes ([`crate::upstream`]) and the throwaway PKI ([`crate::pki_fixture`],
//! whose `--genkey` runs it too).

/// The environment variable naming the upstream `openvpn` every test runs as the referee: a
/// path (e.g. an OpenVPN 2.7 build) or a program on `PATH`. Unset or empty: `openvpn` from
/// `PATH`, Debian's 2.6 in CI.
pub const REFEREE_ENV: &str = "OPENVPN_REFEREE";

/// The upstream `openvpn` program the lab starts ([`REFEREE_ENV`], else `openvpn`). Every
/// place in `lab`, `conformance` and `bench` that runs upstream OpenVPN goes through it.
///
/// # Panics
///
/// When the variable is set to text that is not UTF-8 (it could not be passed on as given).
pub fn referee() -> String {
    match std::env::var(REFEREE_ENV) {
        Ok(v) if !v.is_empty() => v,
        Ok(_) | Err(std::env::VarError::NotPresent) => "openvpn".to_owned(),
        Err(std::env::VarError::NotUnicode(v)) => panic!("{REFEREE_ENV}={v:?} is not UTF-8"),
    }
}
