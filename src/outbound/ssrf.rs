//! The SSRF guard. A submitter chooses a URL the server then requests (a
//! job's `webhook_url`, a `document.url`), so a URL must not reach what only
//! the server can reach (loopback, private networks, link-local and cloud
//! metadata addresses, reserved ranges), and must be http or https.
//!
//! URLs are parsed as browsers do (the `url` crate, WHATWG), so `0x7f000001`,
//! `2130706433` and `127.1` are all 127.0.0.1, and an IPv4-mapped IPv6 address
//! (`::ffff:a.b.c.d`) is judged as the IPv4 address it maps; the IPv4-translated
//! form (`::ffff:0:a.b.c.d`) is refused outright. A host name is resolved and every
//! address it resolves to must pass. When sending, the same guard is the HTTP
//! client's resolver: the connection goes only to addresses it checked, so a
//! name that resolves elsewhere the second time (DNS rebinding) gains nothing.
//!
//! An allow-list ([`AllowList`]: `DOCSTREAM_WEBHOOK_ALLOW` for webhooks,
//! `DOCSTREAM_FILE_FETCH_ALLOW` for documents) admits chosen addresses
//! anyway, for development and tests. [`guarded_client`] is the HTTP client
//! both send with.

use crate::config::canonical;
pub use crate::config::AllowList;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use url::{Host, Url};

/// The longest a name lookup may take; beyond it the name counts as
/// unresolvable (for now: a failed lookup may pass).
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a URL is refused. It reads after the name of the field that held the
/// URL: [`Forbidden::of`] puts them together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Forbidden {
    /// Not a URL at all.
    #[error("is not a URL")]
    Malformed,
    /// Not http or https.
    #[error("must be http or https, not {0}")]
    Scheme(String),
    /// No host to send to.
    #[error("has no host")]
    NoHost,
    /// An address the server must not reach. The answer names the host as
    /// the client wrote it, never the address it resolved to, and says the
    /// same as for a name that does not resolve: either would tell a caller
    /// the server's internal DNS ([`Forbidden::detail`] is for the
    /// operator's log).
    #[error("host {host} {}", REFUSED)]
    Address {
        /// The host as written.
        host: String,
        /// The refused address.
        addr: IpAddr,
        /// What kind of address it is.
        kind: &'static str,
    },
    /// The name does not resolve; answered as a refused address is.
    #[error("host {host} {}", REFUSED)]
    Unresolvable {
        /// The host as written.
        host: String,
        /// What the resolver said.
        reason: String,
    },
}

/// What a refused host is answered, whether it resolves to an address the
/// server must not reach or does not resolve at all: one text, so that a
/// caller cannot tell an internal name from an unknown one.
const REFUSED: &str = "is not a host the server may reach";

impl Forbidden {
    /// The refusal of the URL in `field`, as the caller is answered:
    /// "webhook_url has no host".
    pub fn of(&self, field: &str) -> String {
        format!("{field} {self}")
    }

    /// The refusal with its cause (the address and its kind, or what the
    /// resolver said), for the operator's log only.
    pub fn detail(&self) -> String {
        match self {
            Self::Address { host, addr, kind } => {
                format!("host {host} resolves to {addr}, a {kind} address")
            }
            Self::Unresolvable { host, reason } => {
                format!("host {host} does not resolve: {reason}")
            }
            other => other.to_string(),
        }
    }
}

/// Whether `ip` is a public unicast address: not loopback, private, shared
/// (CGNAT), link-local (cloud metadata lives there), multicast, documentation,
/// benchmarking or reserved; for IPv6 also not unique-local, site-local,
/// discard-only (`100::/64`), or a form that embeds an IPv4 address (NAT64,
/// 6to4, Teredo, IPv4-compatible, IPv4-translated `::ffff:0:0/96`).
pub fn is_public(ip: IpAddr) -> bool {
    special_use(ip).is_none()
}

/// What kind of non-public address `ip` is, if it is one.
fn special_use(ip: IpAddr) -> Option<&'static str> {
    match canonical(ip) {
        IpAddr::V4(v4) => {
            let [a, b, c, _] = v4.octets();
            let kind = match () {
                _ if v4.is_loopback() => "loopback",
                _ if v4.is_private() => "private",
                _ if v4.is_link_local() => "link-local, where cloud metadata lives",
                _ if a == 100 && (64..128).contains(&b) => "shared (CGNAT)",
                _ if v4.is_unspecified() || a == 0 => "this network",
                _ if v4.is_multicast() => "multicast",
                _ if v4.is_broadcast() || a >= 240 => "reserved",
                _ if v4.is_documentation() || (a == 198 && (b == 18 || b == 19)) => {
                    "documentation or benchmarking"
                }
                _ if a == 192 && b == 0 && c == 0 => "IETF protocol assignment",
                _ => return None,
            };
            Some(kind)
        }
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let kind = match () {
                _ if v6.is_loopback() => "loopback",
                _ if v6.is_unspecified() => "unspecified",
                _ if v6.is_multicast() => "multicast",
                _ if (s[0] & 0xfe00) == 0xfc00 => "unique-local (private)",
                _ if (s[0] & 0xffc0) == 0xfe80 => "link-local",
                _ if (s[0] & 0xffc0) == 0xfec0 => "site-local",
                _ if s[0] == 0x2001 && s[1] == 0x0db8 => "documentation",
                // RFC 6666: a blackhole prefix; nothing legitimate listens there.
                _ if s[..4] == [0x0100, 0, 0, 0] => "discard-only",
                // `::ffff:0:a.b.c.d` (RFC 2765 SIIT): a translator turns it into
                // a.b.c.d, so the whole /96 is refused, whatever it embeds.
                _ if s[..6] == [0, 0, 0, 0, 0xffff, 0] => "IPv4-translated (SIIT)",
                _ if (s[0] == 0x2001 && s[1] == 0)
                    || (s[0] == 0x0064 && s[1] == 0xff9b)
                    || s[0] == 0x2002
                    || s[..6] == [0; 6] =>
                {
                    "IPv4 embedded in Teredo, NAT64, 6to4 or IPv4-compatible form"
                }
                _ => return None,
            };
            Some(kind)
        }
    }
}

/// Checks webhook URLs and resolves their hosts to the addresses it admits.
#[derive(Debug, Clone, Default)]
pub struct Guard {
    allow: Arc<AllowList>,
}

impl Guard {
    /// A guard admitting public addresses and `allow`.
    pub fn new(allow: AllowList) -> Self {
        Self {
            allow: Arc::new(allow),
        }
    }

    /// Whether the guard admits `ip`: a public address, or one its allow-list names.
    pub fn admits(&self, ip: IpAddr) -> bool {
        is_public(ip) || self.allow.contains(ip)
    }

    fn refusal(&self, host: &str, addr: IpAddr) -> Forbidden {
        Forbidden::Address {
            host: host.to_owned(),
            addr,
            kind: special_use(addr).unwrap_or("non-public"),
        }
    }

    /// Checks `url` and returns the addresses it may be sent to.
    pub async fn check(&self, url: &str) -> Result<Vec<SocketAddr>, Forbidden> {
        let url = Url::parse(url).map_err(|_| Forbidden::Malformed)?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(Forbidden::Scheme(url.scheme().to_owned()));
        }
        let port = url.port_or_known_default().unwrap_or(80);
        let ip = match url.host() {
            None => return Err(Forbidden::NoHost),
            Some(Host::Domain(name)) => return self.resolve(name, port).await,
            Some(Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(Host::Ipv6(ip)) => IpAddr::V6(ip),
        };
        match self.admits(ip) {
            true => Ok(vec![SocketAddr::new(ip, port)]),
            false => Err(self.refusal(url.host_str().unwrap_or_default(), ip)),
        }
    }

    /// Resolves `name`; refuses it if any address it resolves to is refused.
    async fn resolve(&self, name: &str, port: u16) -> Result<Vec<SocketAddr>, Forbidden> {
        let unresolvable = |reason: String| Forbidden::Unresolvable {
            host: name.to_owned(),
            reason,
        };
        // A fully qualified name ("localhost.") is the same name without its
        // root dot; some resolvers only know the short form.
        let lookup = name.strip_suffix('.').unwrap_or(name);
        let looked_up =
            tokio::time::timeout(LOOKUP_TIMEOUT, tokio::net::lookup_host((lookup, port)))
                .await
                .map_err(|_| unresolvable(format!("no answer within {LOOKUP_TIMEOUT:?}")))?;
        let addrs: Vec<SocketAddr> = looked_up
            .map_err(|e| unresolvable(e.to_string()))?
            .collect();
        if addrs.is_empty() {
            return Err(unresolvable("no addresses".into()));
        }
        if let Some(refused) = addrs.iter().find(|a| !self.admits(a.ip())) {
            return Err(self.refusal(name, refused.ip()));
        }
        Ok(addrs)
    }
}

/// The HTTP client's resolver: connections go only to checked addresses.
impl reqwest::dns::Resolve for Guard {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let guard = self.clone();
        Box::pin(async move {
            let addrs = guard.resolve(name.as_str(), 0).await?;
            Ok(Box::new(addrs.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The client of requests to addresses a submitter chose (webhook attempts,
/// `document.url` fetches): no redirects, no proxy (either would take the
/// request past the guard), bounded time, the guard as resolver, and HTTPS
/// verified against the system's root certificates.
pub fn guarded_client(guard: &Guard, timeout: Duration, agent: &'static str) -> reqwest::Client {
    crate::outbound::install_tls_provider();
    let builder = |native_roots: bool| {
        let builder = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .timeout(timeout)
            .connect_timeout(timeout)
            .dns_resolver(Arc::new(guard.clone()))
            .user_agent(agent);
        if native_roots {
            builder.build()
        } else {
            builder.tls_certs_only([]).build()
        }
    };
    builder(true).unwrap_or_else(|e| {
        tracing::error!(error = %e, "the system's root certificates did not load; https webhooks and document fetches will fail until they do");
        builder(false).expect("a client without root certificates always builds")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn loopback_private_metadata_and_odd_spellings_are_refused() {
        let guard = Guard::default();
        for url in [
            "http://127.0.0.1/hook",
            "http://[::1]/hook",
            "http://169.254.169.254/latest/meta-data/",
            "http://[::ffff:169.254.169.254]/",
            "http://0x7f000001/",
            "http://2130706433/",
            "http://127.1/",
            "http://10.0.0.1/",
            "http://192.168.1.20:8080/",
            "http://100.100.100.200/",
            "http://[fd00:ec2::254]/",
            "http://[64:ff9b::7f00:1]/",
            "http://[::ffff:0:7f00:1]/",
            "http://[::ffff:0:a9fe:a9fe]/",
            "http://[100::1]/",
            "http://0.0.0.0/",
            "http://localhost/",
            "http://localhost./",
            "file:///etc/passwd",
            "gopher://example.com/",
            "not a url",
        ] {
            assert!(guard.check(url).await.is_err(), "{url} was admitted");
        }
    }

    #[tokio::test]
    async fn ipv4_translated_and_discard_only_addresses_are_refused_however_spelled() {
        let guard = Guard::default();
        let translated = [
            "http://[::ffff:0:7f00:1]/",
            "http://[::ffff:0:a9fe:a9fe]/",
            "http://[::FFFF:0:A9FE:A9FE]:8080/hook",
            "http://[::ffff:0:127.0.0.1]/",
            "http://[::ffff:0:169.254.169.254]/latest/meta-data/",
            "http://[0:0:0:0:ffff:0:7f00:1]/",
            "http://[0000:0000:0000:0000:ffff:0000:0a00:0001]/",
            "http://[::ffff:0:0:0]/",
            // A public IPv4 address in translated form is refused all the same:
            // the whole /96 is special-use, not just the bad addresses in it.
            "http://[::ffff:0:5db8:d70e]/",
            "http://[::ffff:0:93.184.215.14]/",
        ];
        let discard = [
            "http://[100::1]/",
            "http://[100::]/",
            "http://[0100::1]:443/",
            "https://[100:0:0:0:ffff:ffff:ffff:ffff]/",
            "http://[100::ffff:127.0.0.1]/",
            "http://[100::7f00:1]/",
        ];
        for (urls, kind) in [
            (&translated[..], "IPv4-translated (SIIT)"),
            (&discard[..], "discard-only"),
        ] {
            for url in urls {
                match guard.check(url).await {
                    Err(Forbidden::Address { kind: got, .. }) => assert_eq!(got, kind, "{url}"),
                    other => panic!("{url} was not refused as {kind}: {other:?}"),
                }
            }
        }
        for ip in [
            "::ffff:0:7f00:1",
            "::ffff:0:a9fe:a9fe",
            "100::1",
            "100::abcd:1",
        ] {
            assert!(!is_public(ip.parse().unwrap()), "{ip}");
        }
        // An allow list admits the translated form only when it names it:
        // allowing 127.0.0.1 does not allow ::ffff:0:127.0.0.1.
        let v4_only = Guard::new(str::parse::<AllowList>("127.0.0.1/32").unwrap());
        assert!(v4_only.check("http://127.0.0.1:9/").await.is_ok());
        assert!(v4_only.check("http://[::ffff:0:7f00:1]:9/").await.is_err());
        let translated_ok =
            Guard::new(str::parse::<AllowList>("::ffff:0:0:0/96, 100::/64").unwrap());
        assert!(translated_ok
            .check("http://[::ffff:0:7f00:1]:9/")
            .await
            .is_ok());
        assert!(translated_ok.check("http://[100::1]:9/").await.is_ok());
    }

    #[tokio::test]
    async fn a_refusal_names_the_host_not_what_it_resolved_to() {
        let refused = Guard::default().check("http://localhost:9/hook").await;
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("localhost"), "{message}");
        for resolved in ["127.0.0.1", "::1", "loopback"] {
            assert!(!message.contains(resolved), "{message}");
        }
    }

    /// A name that resolves to a refused address and a name that does not
    /// resolve are refused in the same words, so the answer tells a caller
    /// nothing of the server's DNS; the cause stays in the detail the
    /// operator's log gets.
    #[tokio::test]
    async fn an_internal_name_and_an_unknown_name_are_refused_in_the_same_words() {
        let guard = Guard::default();
        let internal = guard.check("http://localhost:9/hook").await.unwrap_err();
        let unknown = guard.check("http://no-such-host.invalid:9/hook").await;
        let unknown = unknown.unwrap_err();
        assert!(
            matches!(internal, Forbidden::Address { .. }),
            "{internal:?}"
        );
        assert!(
            matches!(unknown, Forbidden::Unresolvable { .. }),
            "{unknown:?}"
        );
        let words = |refused: &Forbidden, host: &str| refused.to_string().replace(host, "HOST");
        assert_eq!(
            words(&internal, "localhost"),
            words(&unknown, "no-such-host.invalid")
        );
        assert!(
            internal.detail().contains("loopback"),
            "{}",
            internal.detail()
        );
        assert!(
            unknown.detail().contains("does not resolve"),
            "{}",
            unknown.detail()
        );
    }

    #[tokio::test]
    async fn public_addresses_pass_and_the_allow_list_admits_its_blocks() {
        let guard = Guard::default();
        assert_eq!(
            guard.check("https://93.184.215.14/hook").await.unwrap(),
            vec!["93.184.215.14:443".parse().unwrap()]
        );
        assert!(guard.check("http://[2606:4700::1111]:8080/").await.is_ok());
        let allow = str::parse::<AllowList>("127.0.0.1/32, ::1, 10.1.0.0/16").unwrap();
        let guard = Guard::new(allow.clone());
        assert!(guard.check("http://127.0.0.1:9/").await.is_ok());
        assert!(guard.check("http://[::ffff:127.0.0.1]:9/").await.is_ok());
        assert!(guard.check("http://[::1]:9/").await.is_ok());
        assert!(guard.check("http://10.1.200.3/").await.is_ok());
        assert!(guard.check("http://10.2.0.1/").await.is_err());
        assert!(guard.check("http://127.0.0.2/").await.is_err());
        assert!(allow.contains("10.1.0.0".parse().unwrap()));
        for bad in ["10.0.0.0/33", "example.com", "1.2.3.4/x"] {
            assert!(str::parse::<AllowList>(bad).is_err(), "{bad}");
        }
    }
}
