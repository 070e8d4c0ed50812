//! `orc:plugin/http`: outgoing HTTP, only where the environment's policy allows. Two checks, both
//! before any packet leaves: the origin (scheme, host, port) of every request must be one the
//! policy names, and every address the host name resolves to must be allowed by the policy's
//! [`AddressPolicy`] — the resolver hook filters the very addresses the client then connects to,
//! so there is no window between check and connect (DNS rebinding), and a granted name that
//! resolves to loopback, link-local or a cloud metadata address is refused unless the policy
//! names that network. Redirects are not followed (a redirect could leave the allowed origins),
//! responses are capped in size, and a plugin names a secret that the host injects as the
//! `Authorization` header, so the plugin never holds its value. A secret goes only to the origins
//! it is bound to, and only over `https://` unless the policy allows plain HTTP for secrets; both
//! are checked before anything is sent.

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
pub use ipnet::IpNet;

use crate::bindings::host::orc::plugin::http::{Host, Request, Response};
use crate::bindings::host::orc::plugin::types::{Error, ErrorKind};
use crate::capability::wit_error;
use crate::state::CallState;

/// An allowed origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub scheme: String,
    pub host: String,
    pub port: u16,
}

impl Origin {
    /// Parses `scheme://host[:port]` (http or https, the port defaulting by scheme); a path,
    /// query, fragment or user is refused: an origin names a server, nothing inside it. The one
    /// origin parser: `http.allowed_origins` and the origins a host-held secret is bound to.
    pub fn parse(text: &str) -> Result<Origin, String> {
        let rest = text.split_once("://").map(|(_, rest)| rest.trim_end_matches('/'));
        if rest.is_some_and(|rest| rest.contains(['/', '?', '#', '@'])) {
            return Err(format!(
                "`{text}` is not an origin: give `scheme://host[:port]`, without path, query or user"
            ));
        }
        let url = reqwest::Url::parse(text).map_err(|e| format!("`{text}` is not a URL: {e}"))?;
        origin_of(&url).ok_or_else(|| format!("`{text}` has no host or an unsupported scheme"))
    }
}

/// `scheme://host:port`, the port always given.
impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// Origins as a message lists them: `https://a:443, https://b:443`, or `none`.
pub fn list_origins(origins: &[Origin]) -> String {
    if origins.is_empty() {
        return "none".to_string();
    }
    origins.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
}

fn origin_of(url: &reqwest::Url) -> Option<Origin> {
    let scheme = url.scheme();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    Some(Origin {
        scheme: scheme.to_string(),
        host: url.host_str()?.to_ascii_lowercase(),
        port: url.port_or_known_default()?,
    })
}

/// Which addresses a granted origin's host may resolve to (or be, for an IP literal).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AddressPolicy {
    /// Globally routable unicast addresses only. The default.
    #[default]
    Public,
    /// Public addresses and private ones (RFC 1918, shared 100.64.0.0/10, IPv6 unique-local);
    /// never loopback, link-local, cloud metadata, multicast or reserved addresses.
    PublicAndPrivate,
    /// Only addresses inside these networks, whatever their kind: the one way to reach loopback
    /// (tests, a sidecar) or a link-local service.
    Networks(Vec<IpNet>),
}

/// What kind of address an IP is, for the policy and for messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    Public,
    Private,
    Loopback,
    LinkLocal,
    /// A cloud provider's instance metadata service (169.254.169.254, fd00:ec2::254,
    /// 100.100.100.200): never reachable unless a network names it.
    Metadata,
    Unspecified,
    Multicast,
    /// Broadcast, documentation, benchmarking and other reserved ranges.
    Reserved,
}

impl AddressKind {
    pub fn of(ip: IpAddr) -> AddressKind {
        match ip {
            IpAddr::V4(v4) => kind_v4(v4),
            IpAddr::V6(v6) => kind_v6(v6),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            AddressKind::Public => "public",
            AddressKind::Private => "private",
            AddressKind::Loopback => "loopback",
            AddressKind::LinkLocal => "link-local",
            AddressKind::Metadata => "cloud metadata",
            AddressKind::Unspecified => "unspecified",
            AddressKind::Multicast => "multicast",
            AddressKind::Reserved => "reserved",
        }
    }
}

const METADATA: [IpAddr; 3] = [
    IpAddr::V4(Ipv4Addr::new(169, 254, 169, 254)),
    IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254)),
];

fn kind_v4(ip: Ipv4Addr) -> AddressKind {
    let [a, b, c, _] = ip.octets();
    if METADATA.contains(&IpAddr::V4(ip)) {
        AddressKind::Metadata
    } else if a == 0 {
        AddressKind::Unspecified
    } else if ip.is_loopback() {
        AddressKind::Loopback
    } else if ip.is_link_local() {
        AddressKind::LinkLocal
    } else if ip.is_private() || (a == 100 && (64..128).contains(&b)) {
        AddressKind::Private
    } else if ip.is_multicast() {
        AddressKind::Multicast
    } else if a >= 240
        || (a == 192 && b == 0 && (c == 0 || c == 2))
        || (a == 198 && (b == 18 || b == 19))
        || (a == 198 && b == 51 && c == 100)
        || (a == 203 && b == 0 && c == 113)
    {
        AddressKind::Reserved
    } else {
        AddressKind::Public
    }
}

fn kind_v6(ip: Ipv6Addr) -> AddressKind {
    // An IPv4 address in IPv6 clothing (mapped, or NAT64) is what it carries.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return kind_v4(v4);
    }
    let s = ip.segments();
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return kind_v4(Ipv4Addr::from_bits((u32::from(s[6]) << 16) | u32::from(s[7])));
    }
    if METADATA.contains(&IpAddr::V6(ip)) {
        AddressKind::Metadata
    } else if ip.is_unspecified() {
        AddressKind::Unspecified
    } else if ip.is_loopback() {
        AddressKind::Loopback
    } else if ip.is_unicast_link_local() {
        AddressKind::LinkLocal
    } else if ip.is_unique_local() {
        AddressKind::Private
    } else if ip.is_multicast() {
        AddressKind::Multicast
    } else if (s[0] == 0x2001 && s[1] == 0xdb8) || s[0] & 0xe000 != 0x2000 {
        // Documentation, and everything outside global unicast 2000::/3.
        AddressKind::Reserved
    } else {
        AddressKind::Public
    }
}

impl AddressPolicy {
    /// Whether `ip` may be connected to.
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        match self {
            AddressPolicy::Public => AddressKind::of(ip) == AddressKind::Public,
            AddressPolicy::PublicAndPrivate => matches!(AddressKind::of(ip), AddressKind::Public | AddressKind::Private),
            AddressPolicy::Networks(nets) => nets.iter().any(|n| n.contains(&ip)),
        }
    }

    fn describe(&self) -> String {
        match self {
            AddressPolicy::Public => "public addresses only".to_string(),
            AddressPolicy::PublicAndPrivate => "public and private addresses only".to_string(),
            AddressPolicy::Networks(nets) => {
                let nets: Vec<String> = nets.iter().map(ToString::to_string).collect();
                format!("addresses in {} only", nets.join(", "))
            }
        }
    }
}

/// A host name (or IP literal) whose every address the policy refused.
#[derive(Debug)]
struct AddressRefused {
    host: String,
    refused: Vec<IpAddr>,
    policy: String,
}

impl fmt::Display for AddressRefused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let refused: Vec<String> = self
            .refused
            .iter()
            .map(|ip| format!("{ip} ({})", AddressKind::of(ip.to_canonical()).as_str()))
            .collect();
        write!(
            f,
            "outgoing HTTP to {} refused: it resolves to {}, and this environment's policy allows {}",
            self.host,
            refused.join(", "),
            self.policy
        )
    }
}

impl std::error::Error for AddressRefused {}

/// The client's resolver: resolves with the system resolver, then keeps only the addresses the
/// policy allows. The client connects to exactly what this returns.
struct CheckedResolver {
    addresses: Arc<AddressPolicy>,
}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let policy = self.addresses.clone();
        let host = name.as_str().to_string();
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let (allowed, refused): (Vec<SocketAddr>, Vec<SocketAddr>) = resolved.into_iter().partition(|addr| policy.allows(addr.ip()));
            if allowed.is_empty() && !refused.is_empty() {
                return Err(Box::new(AddressRefused {
                    host,
                    refused: refused.iter().map(SocketAddr::ip).collect(),
                    policy: policy.describe(),
                }) as Box<dyn std::error::Error + Send + Sync>);
            }
            if !refused.is_empty() {
                tracing::debug!(%host, ?refused, "left out addresses the HTTP policy refuses");
            }
            Ok(Box::new(allowed.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// The policy's refusal somewhere in an error's chain of sources.
fn refusal_in<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a AddressRefused> {
    let mut next = Some(error);
    while let Some(e) = next {
        if let Some(refused) = e.downcast_ref::<AddressRefused>() {
            return Some(refused);
        }
        next = e.source();
    }
    None
}

/// A host-held secret as the client sends it: the `Authorization` header value, and the only
/// origins it may be sent to. `Debug` shows the origins, never the value.
#[derive(Clone, PartialEq, Eq)]
pub struct BoundSecret {
    pub value: String,
    pub origins: Vec<Origin>,
}

impl fmt::Debug for BoundSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundSecret")
            .field("origins", &self.origins)
            .finish_non_exhaustive()
    }
}

/// What an environment allows. `Debug` names the secrets, never their values.
#[derive(Clone)]
pub struct HttpPolicy {
    pub allowed: Vec<Origin>,
    /// Where the allowed origins' hosts may resolve to.
    pub addresses: AddressPolicy,
    /// Secret name → its value and the origins it is bound to.
    pub secrets: HashMap<String, BoundSecret>,
    /// Secrets may be sent over plain `http://` (to an origin they are bound to); otherwise only
    /// over `https://`.
    pub secrets_over_plain_http: bool,
    pub timeout: Duration,
    pub max_response_bytes: usize,
}

impl fmt::Debug for HttpPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut secrets: Vec<(&str, &[Origin])> = self.secrets.iter().map(|(k, v)| (k.as_str(), v.origins.as_slice())).collect();
        secrets.sort_unstable_by_key(|(name, _)| *name);
        f.debug_struct("HttpPolicy")
            .field("allowed", &self.allowed)
            .field("addresses", &self.addresses)
            .field("secrets", &secrets)
            .field("secrets_over_plain_http", &self.secrets_over_plain_http)
            .field("timeout", &self.timeout)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl Default for HttpPolicy {
    fn default() -> Self {
        HttpPolicy {
            allowed: Vec::new(),
            addresses: AddressPolicy::default(),
            secrets: HashMap::new(),
            secrets_over_plain_http: false,
            timeout: Duration::from_secs(30),
            max_response_bytes: 16 << 20,
        }
    }
}

/// A policy and the client that enforces it.
#[derive(Debug)]
pub struct HttpAccess {
    policy: HttpPolicy,
    client: Option<reqwest::Client>,
}

impl HttpAccess {
    /// Refuses every request.
    pub fn deny_all() -> HttpAccess {
        HttpAccess {
            policy: HttpPolicy::default(),
            client: None,
        }
    }

    pub fn new(policy: HttpPolicy) -> Result<HttpAccess, String> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(policy.timeout)
            .no_proxy()
            .dns_resolver(CheckedResolver {
                addresses: Arc::new(policy.addresses.clone()),
            })
            .build()
            .map_err(|e| format!("cannot build HTTP client: {e}"))?;
        Ok(HttpAccess {
            policy,
            client: Some(client),
        })
    }

    /// Checks the request against the policy; the error names the refused origin, address or
    /// secret. A host name's addresses are checked by the resolver, an IP literal's here (the
    /// client does not resolve literals). A secret must be bound to the request's origin, and
    /// the origin be `https://` unless the policy allows secrets over plain HTTP.
    fn check(&self, url: &reqwest::Url, secret: Option<&str>) -> Result<Option<String>, Error> {
        let origin =
            origin_of(url).ok_or_else(|| wit_error(ErrorKind::InvalidInput, format!("`{url}` is not an http(s) URL with a host")))?;
        if !self.policy.allowed.contains(&origin) {
            return Err(wit_error(
                ErrorKind::Denied,
                format!("outgoing HTTP to {origin} is not allowed by this environment's policy"),
            ));
        }
        let literal = origin.host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>()
            && !self.policy.addresses.allows(ip)
        {
            let refused = AddressRefused {
                host: origin.host.clone(),
                refused: vec![ip],
                policy: self.policy.addresses.describe(),
            };
            return Err(wit_error(ErrorKind::Denied, refused.to_string()));
        }
        let Some(name) = secret else {
            return Ok(None);
        };
        let bound = self
            .policy
            .secrets
            .get(name)
            .ok_or_else(|| wit_error(ErrorKind::Denied, format!("secret `{name}` is not defined for this environment")))?;
        if !bound.origins.contains(&origin) {
            return Err(wit_error(
                ErrorKind::Denied,
                format!(
                    "secret `{name}` may not be sent to {origin}: it is bound to {}",
                    list_origins(&bound.origins)
                ),
            ));
        }
        if origin.scheme != "https" && !self.policy.secrets_over_plain_http {
            return Err(wit_error(
                ErrorKind::Denied,
                format!(
                    "secret `{name}` may not be sent to {origin} over plain HTTP: secrets go over https only unless the environment's setting `http.secrets_over_plain_http` is true"
                ),
            ));
        }
        Ok(Some(bound.value.clone()))
    }
}

impl Host for CallState {
    async fn send(&mut self, request: Request) -> Result<Response, Error> {
        let access = self.ctx.http.clone();
        let url = reqwest::Url::parse(&request.url)
            .map_err(|e| wit_error(ErrorKind::InvalidInput, format!("`{}` is not a URL: {e}", request.url)))?;
        let secret = access.check(&url, request.secret.as_deref())?;
        let client = access
            .client
            .as_ref()
            .ok_or_else(|| wit_error(ErrorKind::Denied, "outgoing HTTP is not allowed"))?;
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .map_err(|_| wit_error(ErrorKind::InvalidInput, format!("`{}` is not an HTTP method", request.method)))?;
        let mut builder = client.request(method, url.clone());
        if let Some((name, _)) = request.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case("host")) {
            // The host names the server from the URL the policy checked; a plugin's own `Host`
            // would send the request (and any secret) to another virtual host behind it.
            return Err(wit_error(
                ErrorKind::Denied,
                format!("a plugin may not set the `{name}` header: it follows from the URL"),
            ));
        }
        for (k, v) in &request.headers {
            if k.eq_ignore_ascii_case("authorization") && secret.is_some() {
                continue;
            }
            builder = builder.header(k, v);
        }
        if let Some(value) = &secret {
            builder = builder.header(reqwest::header::AUTHORIZATION, value);
        }
        if let Some(body) = request.body {
            builder = builder.body(body);
        }
        if let Some(ms) = request.timeout_ms {
            // Shorter than the policy's, never longer.
            builder = builder.timeout(Duration::from_millis(ms.into()).min(access.policy.timeout));
        }
        let response = builder.send().await.map_err(|e| {
            if let Some(refused) = refusal_in(&e) {
                return wit_error(ErrorKind::Denied, refused.to_string());
            }
            let kind = if e.is_connect() || e.is_timeout() {
                ErrorKind::Unavailable
            } else {
                ErrorKind::Retryable
            };
            wit_error(kind, format!("{} {}: {e}", request.method, url))
        })?;
        let status = response.status().as_u16();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str().to_string(), v.to_string())))
            .collect();
        let mut body = Vec::new();
        let mut stream = response.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| wit_error(ErrorKind::Retryable, format!("reading the response of {url}: {e}")))?;
            if body.len() + chunk.len() > access.policy.max_response_bytes {
                return Err(wit_error(
                    ErrorKind::Permanent,
                    format!("the response of {url} exceeds {} bytes", access.policy.max_response_bytes),
                ));
            }
            body.extend_from_slice(&chunk);
        }
        // A server that echoes the request (many do, on errors) must not hand the secret to the
        // plugin that was not to hold it.
        if let Some(value) = &secret {
            for (_, v) in &mut headers {
                let mut bytes = std::mem::take(v).into_bytes();
                redact(&mut bytes, value);
                *v = String::from_utf8_lossy(&bytes).into_owned();
            }
            redact(&mut body, value);
        }
        Ok(Response { status, headers, body })
    }
}

/// What replaces a secret in what the plugin is handed.
const REDACTED: &[u8] = b"[redacted]";

/// Replaces in `bytes` every occurrence of the secret `value` (an `Authorization` header value)
/// and of its credential alone (after a scheme such as `Bearer `), when that is long enough to be
/// a secret rather than a common word.
fn redact(bytes: &mut Vec<u8>, value: &str) {
    let mut needles = vec![value.as_bytes()];
    if let Some((_, credential)) = value.split_once(' ')
        && credential.len() >= 8
    {
        needles.push(credential.as_bytes());
    }
    for needle in needles {
        if needle.is_empty() || bytes.len() < needle.len() {
            continue;
        }
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i..].starts_with(needle) {
                out.extend_from_slice(REDACTED);
                i += needle.len();
            } else {
                out.push(bytes[i]);
                i += 1;
            }
        }
        *bytes = out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_echoed_back_are_redacted() {
        let mut body = br#"{"headers":{"authorization":"Bearer s3cr3t-token-value"},"again":"s3cr3t-token-value"}"#.to_vec();
        redact(&mut body, "Bearer s3cr3t-token-value");
        let text = String::from_utf8(body).unwrap();
        assert_eq!(text, r#"{"headers":{"authorization":"[redacted]"},"again":"[redacted]"}"#);
        let mut short = b"Basic ab and ab".to_vec();
        redact(&mut short, "Basic ab");
        assert_eq!(short, b"[redacted] and ab", "a short credential alone is not a secret worth hiding");
    }

    fn kind(ip: &str) -> AddressKind {
        AddressKind::of(ip.parse().unwrap())
    }

    #[test]
    fn addresses_are_classified() {
        for (ip, expected) in [
            ("93.184.215.14", AddressKind::Public),
            ("2606:4700::1111", AddressKind::Public),
            ("10.1.2.3", AddressKind::Private),
            ("172.31.255.255", AddressKind::Private),
            ("192.168.0.1", AddressKind::Private),
            ("100.64.0.1", AddressKind::Private),
            ("fd12:3456::1", AddressKind::Private),
            ("127.0.0.1", AddressKind::Loopback),
            ("::1", AddressKind::Loopback),
            ("::ffff:127.0.0.1", AddressKind::Loopback),
            ("64:ff9b::a9fe:a9fe", AddressKind::Metadata),
            ("169.254.169.254", AddressKind::Metadata),
            ("fd00:ec2::254", AddressKind::Metadata),
            ("100.100.100.200", AddressKind::Metadata),
            ("169.254.1.1", AddressKind::LinkLocal),
            ("fe80::1", AddressKind::LinkLocal),
            ("0.0.0.0", AddressKind::Unspecified),
            ("::", AddressKind::Unspecified),
            ("224.0.0.1", AddressKind::Multicast),
            ("ff02::1", AddressKind::Multicast),
            ("255.255.255.255", AddressKind::Reserved),
            ("192.0.2.1", AddressKind::Reserved),
            ("2001:db8::1", AddressKind::Reserved),
        ] {
            assert_eq!(kind(ip), expected, "{ip}");
        }
    }

    #[test]
    fn debug_names_secrets_but_never_shows_their_values() {
        let policy = HttpPolicy {
            secrets: HashMap::from([(
                "api-token".to_string(),
                BoundSecret {
                    value: "Bearer hunter2".to_string(),
                    origins: vec![Origin::parse("https://api.example.com").unwrap()],
                },
            )]),
            ..HttpPolicy::default()
        };
        let text = format!("{policy:?} {:?}", HttpAccess::new(policy.clone()).unwrap());
        assert!(
            text.contains("api-token") && text.contains("api.example.com") && !text.contains("hunter2"),
            "{text}"
        );
    }

    #[test]
    fn policies_allow_what_they_say() {
        let public: IpAddr = "93.184.215.14".parse().unwrap();
        let private: IpAddr = "10.0.0.5".parse().unwrap();
        let metadata: IpAddr = "169.254.169.254".parse().unwrap();
        let mapped: IpAddr = "::ffff:10.0.0.5".parse().unwrap();
        assert!(AddressPolicy::Public.allows(public));
        assert!(!AddressPolicy::Public.allows(private));
        assert!(AddressPolicy::PublicAndPrivate.allows(private));
        assert!(!AddressPolicy::PublicAndPrivate.allows(metadata));
        let nets = AddressPolicy::Networks(vec!["10.0.0.0/24".parse().unwrap()]);
        assert!(nets.allows(private) && nets.allows(mapped));
        assert!(!nets.allows(public), "a network list admits nothing else");
        let meta = AddressPolicy::Networks(vec!["169.254.169.254/32".parse().unwrap()]);
        assert!(meta.allows(metadata), "only a named network reaches metadata");
    }
}
