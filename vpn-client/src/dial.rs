//! Reaching the server: directly, or through the HTTP proxy with `CONNECT` and the routing
//! header, all within `connect-timeout`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::BytesMut;
use protocol::config::Family;
use tokio::net::TcpStream;

use crate::settings::{Remote, Settings};

/// An open connection to the server.
#[derive(Debug)]
pub(crate) struct Dialed {
    /// The socket (to the server, or to the proxy that tunnels to it).
    pub stream: TcpStream,
    /// The bytes a proxy sent after its `200` (the start of the server's stream).
    pub leftover: BytesMut,
    /// The addresses on the path to the server, which no pushed route may put into the tunnel
    /// (`protocol::push::PathGuard`): every address this attempt resolved for the host it
    /// dials (the server's, or the proxy's), the one it connected to, and every `remote` and
    /// the `http-proxy` written as an address (through a proxy too, and the remotes of later
    /// attempts: the routes of this push stay while the client reconnects).
    pub path: Vec<IpAddr>,
}

/// Connects to `remote`, directly or through the proxy, with `connect-timeout`.
pub(crate) async fn dial(settings: &Settings, remote: &Remote) -> Result<Dialed, DialError> {
    let timeout = settings.connect_timeout;
    match &settings.http_proxy {
        None => {
            tracing::info!("connecting");
            let attempt = async {
                let addrs = resolve(settings, &remote.host, remote.port).await?;
                let mut last = DialError::NoAddress;
                for &addr in &addrs {
                    match netio::tcp::connect_nodelay(addr).await {
                        Ok(stream) => return Ok((stream, addrs)),
                        Err(source) => last = DialError::Connect { addr, source },
                    }
                }
                Err(last)
            };
            let (stream, addrs) = tokio::time::timeout(timeout, attempt)
                .await
                .map_err(|_| DialError::Timeout { after: timeout })??;
            tracing::info!("TCP connected");
            let path = path(&stream, &addrs, settings);
            Ok(Dialed {
                stream,
                leftover: BytesMut::new(),
                path,
            })
        }
        Some(proxy) => {
            tracing::info!("connecting through the HTTP proxy");
            let addrs = resolve(settings, &proxy.host, proxy.port).await?;
            if addrs.is_empty() {
                return Err(DialError::NoAddress);
            }
            let tunnel =
                netio::http_connect::connect_via_proxy(&addrs, &proxy.request(remote), timeout)
                    .await
                    .map_err(DialError::Proxy)?;
            tracing::info!(
                status = tunnel.response.status,
                reason = tunnel.response.reason,
                "proxy answered 200: tunnel to the server open"
            );
            let path = path(&tunnel.stream, &addrs, settings);
            Ok(Dialed {
                stream: tunnel.stream,
                leftover: tunnel.leftover,
                path,
            })
        }
    }
}

/// See [`Dialed::path`].
fn path(stream: &TcpStream, resolved: &[SocketAddr], settings: &Settings) -> Vec<IpAddr> {
    let mut path: Vec<IpAddr> = resolved.iter().map(SocketAddr::ip).collect();
    path.extend(stream.peer_addr().ok().map(|a| a.ip()));
    let named = settings
        .remotes
        .iter()
        .map(|r| r.host.as_str())
        .chain(settings.http_proxy.as_ref().map(|p| p.host.as_str()));
    path.extend(named.filter_map(|host| host.parse::<IpAddr>().ok()));
    path
}

/// The addresses `host` resolves to that `proto tcp4-client|tcp6-client` allows.
async fn resolve(settings: &Settings, host: &str, port: u16) -> Result<Vec<SocketAddr>, DialError> {
    let addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| DialError::Resolve {
            host: host.to_owned(),
            source,
        })?;
    Ok(addrs
        .filter(|a| family_allows(settings.family, a))
        .collect())
}

/// Whether `proto tcp4-client|tcp6-client` allows dialing `addr`.
fn family_allows(family: Family, addr: &SocketAddr) -> bool {
    match family {
        Family::Any => true,
        Family::V4 => addr.is_ipv4(),
        Family::V6 => addr.is_ipv6(),
    }
}

/// Why one connection attempt failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DialError {
    #[error("cannot resolve {host}")]
    Resolve {
        host: String,
        #[source]
        source: io::Error,
    },
    #[error("the host resolved to no address")]
    NoAddress,
    #[error("TCP connect to {addr} failed")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("no connection within {after:?}")]
    Timeout { after: Duration },
    #[error("HTTP proxy")]
    Proxy(#[source] netio::http_connect::ConnectError),
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::settings::{HttpProxy, TlsMaterial};

    #[tokio::test]
    async fn the_path_holds_what_was_resolved_connected_and_named() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let to = listener.local_addr().unwrap();
        let stream = TcpStream::connect(to).await.unwrap();
        let resolved: Vec<SocketAddr> = vec!["127.0.0.2:1194".parse().unwrap(), to];
        let tls = TlsMaterial::Pem {
            ca: Vec::new(),
            cert: Vec::new(),
            key: Vec::new(),
            peer: pki::tls::PeerPolicy::default(),
        };
        let protection = protocol::session::ControlProtection::None;
        let remotes = vec![
            Remote::new("vpn-seed-server", 1194),
            Remote::new("192.0.2.9", 1194),
            Remote::new("2001:db8::9", 1194),
        ];
        let mut settings = Settings::new(remotes, tls, protection);
        // Every remote written as an address is on the path, the one dialed or not.
        let got = path(&stream, &resolved, &settings);
        let want: Vec<IpAddr> = [
            "127.0.0.2",
            "127.0.0.1",
            "127.0.0.1",
            "192.0.2.9",
            "2001:db8::9",
        ]
        .iter()
        .map(|a| a.parse().unwrap())
        .collect();
        assert_eq!(got, want);
        // Through a proxy named by its address, that address too.
        settings.http_proxy = Some(HttpProxy::new("198.51.100.3", 3128));
        settings.remotes.truncate(1);
        let got = path(&stream, &[], &settings);
        assert_eq!(
            got,
            [
                IpAddr::from([127, 0, 0, 1]),
                IpAddr::from([198, 51, 100, 3])
            ]
        );
    }

    #[test]
    fn the_protocol_family_filters_addresses() {
        let v4: SocketAddr = "192.0.2.1:1194".parse().unwrap();
        let v6: SocketAddr = "[2001:db8::1]:1194".parse().unwrap();
        assert!(family_allows(Family::Any, &v4) && family_allows(Family::Any, &v6));
        assert!(family_allows(Family::V4, &v4) && !family_allows(Family::V4, &v6));
        assert!(!family_allows(Family::V6, &v4) && family_allows(Family::V6, &v6));
    }
}
