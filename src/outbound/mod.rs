//! What every outbound HTTP client shares (webhooks, HTTP extractors, document
//! URLs, the OTLP exporter): the process's TLS provider, and the error text
//! that keeps the useful cause; and for the URLs a submitter chooses (a
//! webhook's, a document's), the SSRF guard ([`ssrf`]).

pub mod ssrf;

/// Makes rustls with the *ring* provider the process's TLS, for every
/// outbound HTTPS client: webhooks, HTTP extractors, the OTLP exporter. The
/// HTTP client is built without a provider of its own (its default would add
/// a C library to every build), so each client builder calls this first; it
/// is idempotent, and a program that embeds the library and installed a
/// provider already keeps its own.
pub fn install_tls_provider() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            // Fails only if another thread installed one meanwhile: fine too.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
    });
}

/// An error and its causes on one line: where HTTP clients keep the useful
/// part ("connection refused"), for logs and stored errors alike.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
