//! Names in CONNECT targets: resolved with the pod's resolver (getaddrinfo, so `/etc/hosts`
//! and `/etc/resolv.conf` as the pod has them), the addresses filtered and ordered by Envoy's
//! `dns_lookup_family`, and kept in a cache shaped like the DNS cache of Envoy's dynamic
//! forward proxy:
//!
//! * an entry is `host:port`, as Envoy keys it; literal addresses never enter it;
//! * an entry younger than [`REFRESH`] (Envoy's default `dns_refresh_rate`) answers without
//!   a query; an older one is resolved again when next asked for;
//! * an entry not asked for during [`HOST_TTL`] (Envoy's default `host_ttl`) is dropped at
//!   the next lookup;
//! * at most `max_hosts` entries: a new name beyond them is refused (`host_overflow`, the
//!   request gets 503).
//!
//! The addresses are checked by the destination policy after resolution, every time.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::metrics::SidecarMetrics;

/// Envoy's default `dns_refresh_rate`.
pub const REFRESH: Duration = Duration::from_secs(60);
/// Envoy's default `host_ttl`.
pub const HOST_TTL: Duration = Duration::from_secs(300);
/// Gardener's `max_hosts`.
pub const DEFAULT_MAX_HOSTS: usize = 8192;

/// Envoy's `dns_lookup_family`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LookupFamily {
    /// `AUTO` (Envoy's default): the IPv6 addresses if there are any, else the IPv4 ones.
    Auto,
    /// `V4_ONLY`.
    V4Only,
    /// `V6_ONLY`.
    V6Only,
    /// `V4_PREFERRED`: the IPv4 addresses if there are any, else the IPv6 ones.
    V4Preferred,
    /// `ALL` (Gardener's): every address, in the resolver's order.
    All,
}

impl LookupFamily {
    /// The value as Envoy spells it.
    pub fn from_envoy(s: &str) -> Option<LookupFamily> {
        Some(match s {
            "AUTO" => LookupFamily::Auto,
            "V4_ONLY" => LookupFamily::V4Only,
            "V6_ONLY" => LookupFamily::V6Only,
            "V4_PREFERRED" => LookupFamily::V4Preferred,
            "ALL" => LookupFamily::All,
            _ => return None,
        })
    }

    /// The addresses this family dials, in order.
    pub fn pick(self, addrs: Vec<IpAddr>) -> Vec<IpAddr> {
        let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) = addrs.iter().partition(|a| a.is_ipv4());
        match self {
            LookupFamily::All => addrs,
            LookupFamily::V4Only => v4,
            LookupFamily::V6Only => v6,
            LookupFamily::Auto if v6.is_empty() => v4,
            LookupFamily::Auto => v6,
            LookupFamily::V4Preferred if v4.is_empty() => v6,
            LookupFamily::V4Preferred => v4,
        }
    }
}

/// The DNS cache's settings (`dns_cache_config`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    /// `name`: the DNS series are `envoy_dns_cache_<name>_*`.
    pub cache_name: String,
    /// `dns_lookup_family`.
    pub family: LookupFamily,
    /// `max_hosts`.
    pub max_hosts: usize,
}

impl Default for DnsSettings {
    fn default() -> Self {
        DnsSettings {
            cache_name: crate::DEFAULT_DNS_CACHE_NAME.into(),
            family: LookupFamily::All,
            max_hosts: DEFAULT_MAX_HOSTS,
        }
    }
}

/// Why a name gave no addresses.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// `max_hosts` names are cached and this one is new.
    #[error("DNS cache full ({max_hosts} hosts)")]
    Overflow {
        /// The limit.
        max_hosts: usize,
    },
    /// The resolver failed.
    #[error("DNS lookup failed")]
    Failed(#[source] io::Error),
    /// The resolver answered, but with no address of the configured family.
    #[error("no address of the configured family ({0:?})")]
    NoAddress(LookupFamily),
    /// The resolver did not answer in time.
    #[error("DNS lookup timed out after {0:?}")]
    Timeout(Duration),
}

/// A name lookup: the pod's resolver in production, a table in tests.
pub type LookupFuture = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send>>;

/// Resolves a host name.
pub trait Resolve: Send + Sync + std::fmt::Debug {
    /// Every address of `host`.
    fn lookup(&self, host: &str, port: u16) -> LookupFuture;
}

/// getaddrinfo on tokio's blocking pool.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn lookup(&self, host: &str, port: u16) -> LookupFuture {
        let host = host.to_owned();
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host.as_str(), port)).await?;
            Ok(addrs.map(|a| a.ip()).collect())
        })
    }
}

#[derive(Debug)]
struct Cached {
    addrs: Vec<IpAddr>,
    resolved: Instant,
    used: Instant,
}

/// The cache; see the module docs.
#[derive(Debug)]
pub struct DnsCache {
    settings: DnsSettings,
    resolver: Arc<dyn Resolve>,
    entries: Mutex<HashMap<String, Cached>>,
}

impl DnsCache {
    /// An empty cache over `resolver`.
    pub fn new(settings: DnsSettings, resolver: Arc<dyn Resolve>) -> DnsCache {
        DnsCache {
            settings,
            resolver,
            entries: Mutex::new(HashMap::new()),
        }
    }

    /// The addresses of `host` (in the configured family's order), from the cache or the
    /// resolver (bounded by `timeout`); counted in `metrics`.
    pub async fn resolve(
        &self,
        host: &str,
        port: u16,
        now: Instant,
        timeout: Duration,
        metrics: &SidecarMetrics,
    ) -> Result<Vec<IpAddr>, DnsError> {
        let key = format!("{}:{port}", host.to_ascii_lowercase());
        {
            let mut entries = self.entries();
            entries.retain(|_, e| now.saturating_duration_since(e.used) < HOST_TTL);
            metrics.dns_hosts(entries.len());
            let full = entries.len() >= self.settings.max_hosts;
            match entries.get_mut(&key) {
                Some(e) if now.saturating_duration_since(e.resolved) < REFRESH => {
                    e.used = now;
                    return Ok(e.addrs.clone());
                }
                Some(_) => {}
                None if full => {
                    metrics.dns_overflow();
                    return Err(DnsError::Overflow {
                        max_hosts: self.settings.max_hosts,
                    });
                }
                None => {}
            }
        }
        metrics.dns_attempt();
        let answer = tokio::time::timeout(timeout, self.resolver.lookup(host, port)).await;
        let addrs = match answer {
            Ok(Ok(addrs)) => self.settings.family.pick(addrs),
            Ok(Err(e)) => {
                metrics.dns_result(false);
                return Err(DnsError::Failed(e));
            }
            Err(_) => {
                metrics.dns_result(false);
                return Err(DnsError::Timeout(timeout));
            }
        };
        if addrs.is_empty() {
            metrics.dns_result(false);
            return Err(DnsError::NoAddress(self.settings.family));
        }
        metrics.dns_result(true);
        let mut entries = self.entries();
        if entries.contains_key(&key) || entries.len() < self.settings.max_hosts {
            entries.insert(
                key,
                Cached {
                    addrs: addrs.clone(),
                    resolved: now,
                    used: now,
                },
            );
        }
        metrics.dns_hosts(entries.len());
        Ok(addrs)
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<String, Cached>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[derive(Debug, Default)]
    struct Table {
        queries: AtomicUsize,
    }

    impl Resolve for Table {
        fn lookup(&self, host: &str, _port: u16) -> LookupFuture {
            self.queries.fetch_add(1, Ordering::Relaxed);
            let answer = match host {
                "both.example" => Ok(vec![
                    "192.0.2.1".parse().unwrap(),
                    "2001:db8::1".parse().unwrap(),
                ]),
                "v4.example" | "V4.example" => Ok(vec!["192.0.2.4".parse().unwrap()]),
                _ => Err(io::Error::new(io::ErrorKind::NotFound, "NXDOMAIN")),
            };
            Box::pin(async move { answer })
        }
    }

    fn ips(s: &[&str]) -> Vec<IpAddr> {
        s.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn families_pick_as_envoy() {
        let both = ips(&["192.0.2.1", "2001:db8::1", "192.0.2.2"]);
        let v4 = ips(&["192.0.2.1"]);
        use LookupFamily::*;
        assert_eq!(All.pick(both.clone()), both);
        assert_eq!(V4Only.pick(both.clone()), ips(&["192.0.2.1", "192.0.2.2"]));
        assert_eq!(V6Only.pick(both.clone()), ips(&["2001:db8::1"]));
        assert_eq!(Auto.pick(both.clone()), ips(&["2001:db8::1"]));
        assert_eq!(Auto.pick(v4.clone()), v4);
        assert_eq!(V4Preferred.pick(both), ips(&["192.0.2.1", "192.0.2.2"]));
        assert_eq!(V4Preferred.pick(ips(&["::1"])), ips(&["::1"]));
        assert_eq!(V6Only.pick(v4), Vec::<IpAddr>::new());
        assert_eq!(LookupFamily::from_envoy("ALL"), Some(All));
        assert_eq!(LookupFamily::from_envoy("all"), None);
    }

    #[tokio::test]
    async fn cache_refresh_ttl_overflow_and_counters() {
        let table = Arc::new(Table::default());
        let settings = DnsSettings {
            max_hosts: 2,
            family: LookupFamily::V6Only,
            ..DnsSettings::default()
        };
        let cache = DnsCache::new(settings, table.clone());
        let m = SidecarMetrics::default();
        let t0 = Instant::now();
        let wait = Duration::from_secs(1);
        let got = cache
            .resolve("both.example", 443, t0, wait, &m)
            .await
            .unwrap();
        assert_eq!(got, ips(&["2001:db8::1"]));
        // Cached: no second query within the refresh interval.
        let later = t0 + Duration::from_secs(59);
        cache
            .resolve("both.example", 443, later, wait, &m)
            .await
            .unwrap();
        assert_eq!(table.queries.load(Ordering::Relaxed), 1);
        // Stale: asked again.
        let stale = t0 + Duration::from_secs(61);
        cache
            .resolve("both.example", 443, stale, wait, &m)
            .await
            .unwrap();
        assert_eq!(table.queries.load(Ordering::Relaxed), 2);
        // No IPv6 address: refused, not cached.
        assert!(matches!(
            cache.resolve("v4.example", 80, stale, wait, &m).await,
            Err(DnsError::NoAddress(LookupFamily::V6Only))
        ));
        assert!(matches!(
            cache.resolve("nx.example", 80, stale, wait, &m).await,
            Err(DnsError::Failed(_))
        ));
        // A second host fills the cache; a third one overflows.
        cache
            .resolve("both.example", 80, stale, wait, &m)
            .await
            .unwrap();
        assert!(matches!(
            cache.resolve("both.example", 8443, stale, wait, &m).await,
            Err(DnsError::Overflow { max_hosts: 2 })
        ));
        let text = m.render();
        let dns = |s: &str| {
            let name = format!("envoy_dns_cache_dynamic_forward_proxy_cache_config_{s} ");
            text.lines()
                .find_map(|l| l.strip_prefix(&name))
                .unwrap_or_else(|| panic!("{name} in\n{text}"))
                .to_owned()
        };
        assert_eq!(dns("dns_query_attempt"), "5");
        assert_eq!(dns("dns_query_success"), "3");
        assert_eq!(dns("dns_query_failure"), "2");
        assert_eq!(dns("host_overflow"), "1");
        assert_eq!(dns("num_hosts"), "2");
        // Unused for the host TTL: dropped, so a new name fits again.
        let idle = stale + HOST_TTL;
        cache
            .resolve("both.example", 8443, idle, wait, &m)
            .await
            .unwrap();
        assert_eq!(cache.entries().len(), 1);
    }
}
