//! vpn2 environment mode: no config file, the vpn2 environment variables
//! ([`Vpn2ClientEnv`]) and vpn2's fixed file layout instead.
//!
//! The client config vpn2 would write for these variables (reference `gardener-vpn2.md` 1.3)
//! is rendered as text by [`render_client_config`] and then loaded exactly like a config file
//! ([`crate::config::load_text`]), so both modes share one mapping. What vpn2 fixes:
//!
//! - `/SECRETS/vpn-client/{ca.crt,tls.crt,tls.key}` and `/SECRETS/tlsauth/vpn.tlsauth` with
//!   key direction 1 (`SECRETS` is `/srv/secrets` unless overridden);
//! - `auth SHA256`, `data-ciphers AES-256-GCM`, `connect-retry 1 5`, `remote-cert-tls server`,
//!   `txqueuelen 1000`, `tcp-nodelay`, `auth-nocache`, `dev tun0`;
//! - `proto` from `IP_FAMILIES`; `remote ENDPOINT` (port 1194);
//! - shoot client (`IS_SHOOT_CLIENT=true`): `http-proxy ENDPOINT OPENVPN_PORT` with the
//!   header `REVERSED_VPN_HEADER_KEY: REVERSED_VPN_HEADER`, and the `up` hook that routes the
//!   seed pod network (`241.0.0.0/8` unless `SEED_POD_NETWORK` is IPv6) into the tunnel.
//!
//! Left out on purpose: `verb 3` (the log level is `--log`) and `management` (we have no
//! management interface). HA mode (tap devices, bonding) is refused.

use std::path::Path;

use ipnet::IpNet;
use protocol::config::env::Vpn2ClientEnv;

use crate::config::{load_text, LoadError, Loaded};

/// vpn2's secrets directory.
pub const DEFAULT_SECRETS_DIR: &str = "/srv/secrets";
/// The name used for the rendered config in messages.
pub const VPN2_CONFIG_NAME: &str = "<vpn2 environment>";

/// Why the environment cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum Vpn2Error {
    /// `ENDPOINT` is not set.
    #[error("ENDPOINT is not set")]
    NoEndpoint,
    /// `IS_HA=true`.
    #[error("IS_HA=true: HA mode (tap devices, bonding) is not supported")]
    Ha,
    /// A value that would break the config line it goes into.
    #[error("{variable}={value:?}: must not contain whitespace, quotes or backslashes")]
    Unquotable {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
    },
    /// The rendered config could not be loaded (a missing secret file, ...).
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// The client config vpn2 writes for `env`, with the secrets under `secrets`.
pub fn render_client_config(env: &Vpn2ClientEnv, secrets: &Path) -> Result<String, Vpn2Error> {
    if env.is_ha {
        return Err(Vpn2Error::Ha);
    }
    let endpoint = env.endpoint.as_deref().ok_or(Vpn2Error::NoEndpoint)?;
    let word = |variable: &'static str, value: &str| -> Result<String, Vpn2Error> {
        if value.is_empty()
            || value
                .chars()
                .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | '#' | ';'))
        {
            return Err(Vpn2Error::Unquotable {
                variable,
                value: value.to_owned(),
            });
        }
        Ok(value.to_owned())
    };
    let endpoint = word("ENDPOINT", endpoint)?;
    let dir = secrets.display().to_string();
    let dir = word("--vpn2-secrets-dir", &dir)?;
    let mut lines = vec![
        "auth-nocache".to_owned(),
        "txqueuelen 1000".to_owned(),
        "tcp-nodelay".to_owned(),
        "pull".to_owned(),
        "data-ciphers AES-256-GCM".to_owned(),
        "tls-client".to_owned(),
        "connect-retry 1 5".to_owned(),
        "auth SHA256".to_owned(),
        format!("tls-auth {dir}/tlsauth/vpn.tlsauth 1"),
        "remote-cert-tls server".to_owned(),
        format!("proto {}", env.ip_families.client_proto()),
        format!("key {dir}/vpn-client/tls.key"),
        format!("cert {dir}/vpn-client/tls.crt"),
        format!("ca {dir}/vpn-client/ca.crt"),
    ];
    if env.is_shoot_client {
        lines.push(format!("http-proxy {endpoint} {}", env.openvpn_port));
        lines.push(format!(
            "http-proxy-option CUSTOM-HEADER {} {}",
            word("REVERSED_VPN_HEADER_KEY", &env.reversed_vpn_header_key)?,
            word("REVERSED_VPN_HEADER", &env.reversed_vpn_header)?,
        ));
    }
    lines.push("dev tun0".to_owned());
    lines.push(format!("remote {endpoint}"));
    if env.is_shoot_client {
        let seed_pods = match env.seed_pod_network {
            Some(IpNet::V6(n)) => n.to_string(),
            _ => "241.0.0.0/8".to_owned(),
        };
        lines.push("script-security 2".to_owned());
        lines.push(format!(
            "up \"/bin/sh -c '/sbin/ip route replace {seed_pods} dev $1' -- \""
        ));
    }
    let mut text = lines.join("\n");
    text.push('\n');
    Ok(text)
}

/// Settings for `env` with the secrets under `secrets` (see the module docs).
pub fn load_env(env: &Vpn2ClientEnv, secrets: &Path) -> Result<Loaded, Vpn2Error> {
    let text = render_client_config(env, secrets)?;
    Ok(load_text(VPN2_CONFIG_NAME, &text)?)
}

/// Whether the process environment `vars` asks for vpn2 environment mode: `ENDPOINT` or
/// `IS_SHOOT_CLIENT` set to something non-empty.
pub fn requested<I, K, V>(vars: I) -> bool
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    vars.into_iter().any(|(k, v)| {
        matches!(k.as_ref(), "ENDPOINT" | "IS_SHOOT_CLIENT") && !v.as_ref().is_empty()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::secrets;
    use netio::http::CustomHeader;
    use protocol::config::Family;

    fn env(vars: &[(&str, &str)]) -> Vpn2ClientEnv {
        Vpn2ClientEnv::parse(vars.iter().copied()).expect("env")
    }

    #[test]
    fn the_shoot_client_environment_gives_vpn2s_settings() {
        let dir = secrets();
        let e = env(&[
            ("IS_SHOOT_CLIENT", "true"),
            ("ENDPOINT", "api.demo.proj.example.com"),
            ("OPENVPN_PORT", "8443"),
            ("REVERSED_VPN_HEADER_KEY", "X-Gardener-Destination"),
            (
                "REVERSED_VPN_HEADER",
                "outbound|1194||vpn-seed-server.shoot--proj--demo.svc.cluster.local",
            ),
        ]);
        let from_env = load_env(&e, dir.path()).expect("env mode").settings;
        // The same settings as the rendered template fixture.
        let fixture = crate::config::tests::VPN2_CLIENT_SHOOT
            .replace("/srv/secrets", &dir.path().display().to_string());
        let from_file = load_text("f", &fixture).expect("fixture").settings;
        assert_eq!(from_env.remotes, from_file.remotes);
        assert_eq!(from_env.http_proxy, from_file.http_proxy);
        assert_eq!(from_env.scripts, from_file.scripts);
        assert_eq!(from_env.tun, from_file.tun);
        assert_eq!(from_env.family, Family::V4);
        assert_eq!(from_env.auth, from_file.auth);
        assert_eq!(from_env.data_ciphers, from_file.data_ciphers);
        assert_eq!(
            (from_env.connect_retry, from_env.connect_retry_max),
            (from_file.connect_retry, from_file.connect_retry_max)
        );
        assert_eq!(
            format!("{:?}", from_env.protection),
            format!("{:?}", from_file.protection)
        );
    }

    #[test]
    fn defaults_dual_stack_and_the_seed_side() {
        let dir = secrets();
        let e = env(&[
            ("IS_SHOOT_CLIENT", "true"),
            ("ENDPOINT", "api.example.com"),
            ("IP_FAMILIES", "IPv6,IPv4"),
            ("SEED_POD_NETWORK", "fd00:10::/64"),
        ]);
        let s = load_env(&e, dir.path()).expect("env").settings;
        let proxy = s.http_proxy.expect("proxy");
        assert_eq!(proxy.port, 8132);
        assert_eq!(
            proxy.custom_headers,
            [CustomHeader::NameValue {
                name: "Reversed-VPN".into(),
                value: "invalid-host".into()
            }]
        );
        assert_eq!(s.family, Family::Any);
        assert!(s.scripts.up.expect("up").argv()[2].contains("fd00:10::/64 dev $1"));

        let seed = env(&[("ENDPOINT", "vpn-seed-server-0")]);
        let s = load_env(&seed, dir.path()).expect("seed side").settings;
        assert!(s.http_proxy.is_none() && s.scripts.up.is_none());
        assert_eq!(s.remotes, [crate::Remote::new("vpn-seed-server-0", 1194)]);
    }

    #[test]
    fn missing_endpoint_ha_and_missing_secrets_are_errors() {
        let dir = secrets();
        let e = env(&[("IS_SHOOT_CLIENT", "true")]);
        assert!(matches!(
            load_env(&e, dir.path()),
            Err(Vpn2Error::NoEndpoint)
        ));
        let e = env(&[
            ("ENDPOINT", "x"),
            ("IS_HA", "true"),
            ("HA_VPN_CLIENTS", "2"),
            ("HA_VPN_SERVERS", "2"),
        ]);
        assert!(matches!(load_env(&e, dir.path()), Err(Vpn2Error::Ha)));
        let e = env(&[("ENDPOINT", "x")]);
        let err = load_env(&e, Path::new("/nonexistent-secrets")).expect_err("no secrets");
        assert!(
            err.to_string().contains("/nonexistent-secrets/vpn-client/"),
            "{err}"
        );
        assert!(requested([("ENDPOINT", "x")]));
        assert!(!requested([("ENDPOINT", ""), ("PATH", "/bin")]));
    }
}
