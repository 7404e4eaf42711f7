//! Trace context: one trace per job, across every process that works on it.
//!
//! - **The job's trace id is its id.** A job id is a UUID, 16 bytes, which is
//!   exactly a W3C trace id; every process derives it from the id, so a
//!   reaper's republish, a retry's delayed event and a webhook belong to the
//!   job's trace without anything stored.
//! - **Records carry `traceparent`.** Every record about a job (its
//!   `extraction.submitted` event, its lifecycle events, its bbox request)
//!   carries a W3C `traceparent` header (`00-<trace id>-<span id>-01`) naming
//!   the span that produced it, and the consumer's span continues from it.
//! - **Log lines carry both ids.** Work on a job runs inside its [`job_span`],
//!   whose fields `job_id` and `trace_id` every log line inside it prints, so
//!   one job is followed across processes with `grep <job id>`.
//! - **Spans leave the process only when asked.** With
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` set, spans are exported over OTLP/HTTP
//!   (protobuf) by a batch exporter on its own thread ([`init`]); without it,
//!   nothing is exported and a span costs what a `tracing` span costs.

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use uuid::Uuid;

/// The Kafka header (and HTTP header) of the W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// Whether spans are exported (set once, by [`init`]).
static EXPORTING: OnceLock<bool> = OnceLock::new();

fn exporting() -> bool {
    EXPORTING.get().copied().unwrap_or(false)
}

/// A W3C `traceparent`: a trace id, the id of the span that sent it, and
/// whether that trace is sampled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    /// The trace.
    pub trace_id: [u8; 16],
    /// The span that produced the record (or made the call).
    pub parent_id: [u8; 8],
    /// The `sampled` flag.
    pub sampled: bool,
}

impl TraceParent {
    /// Parses a `traceparent` header value: version `00` (or a later version,
    /// whose first four fields read the same), a non-zero trace id and span
    /// id in lowercase hex. Anything else is `None`: a bad header is ignored,
    /// never an error.
    pub fn parse(value: &str) -> Option<Self> {
        let mut fields = value.trim().split('-');
        let version = fields.next()?;
        let (trace, parent, flags) = (fields.next()?, fields.next()?, fields.next()?);
        if version.len() != 2 || version == "ff" || (version == "00" && fields.next().is_some()) {
            return None;
        }
        let _version = u8::from_str_radix(version, 16).ok()?;
        let trace_id: [u8; 16] = hex_bytes(trace)?;
        let parent_id: [u8; 8] = hex_bytes(parent)?;
        let flags: [u8; 1] = hex_bytes(flags)?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(Self {
            trace_id,
            parent_id,
            sampled: flags[0] & 1 == 1,
        })
    }

    /// The header's value.
    pub fn header(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            hex(&self.trace_id),
            hex(&self.parent_id),
            u8::from(self.sampled)
        )
    }
}

/// Job `id`'s trace id: the id's bytes.
pub fn job_trace_id(id: Uuid) -> [u8; 16] {
    *id.as_bytes()
}

/// The span of work on job `id`, continuing from `parent` (the
/// `traceparent` of the record that caused the work), if any. Its fields
/// `job_id` and `trace_id` are on every log line inside it.
pub fn job_span(id: Uuid, parent: Option<&TraceParent>) -> tracing::Span {
    let trace_id = job_trace_id(id);
    // At ERROR, so that whatever `DOCSTREAM_LOG` lets through (even `warn`
    // or `error` alone), the lines about a job still carry its ids: a span
    // below the filter's level is disabled, and its fields with it.
    let span = tracing::error_span!("job", job_id = %id, trace_id = %hex(&trace_id));
    if exporting() {
        // The job's trace, whatever the record said (a record's header names
        // its job's trace; one that does not is from an older producer).
        // Without a parent, the span's parent is the job's root, a span id
        // derived from the id: every process agrees on it, and no span has it.
        let parent_id = match parent {
            Some(p) if p.trace_id == trace_id => p.parent_id,
            _ => root_span_id(id),
        };
        let remote = SpanContext::new(
            TraceId::from_bytes(trace_id),
            SpanId::from_bytes(parent_id),
            TraceFlags::SAMPLED,
            true,
            TraceState::default(),
        );
        let context = opentelemetry::Context::new().with_remote_span_context(remote);
        if let Err(e) = span.set_parent(context) {
            tracing::debug!(error = %e, "span parent not set");
        }
    }
    span
}

/// The `traceparent` of a record about job `id` produced now: the current
/// span's id when spans are exported (the consumer's span becomes its
/// child), else a fresh span id in the job's trace.
pub fn traceparent_for(id: Uuid) -> TraceParent {
    let trace_id = job_trace_id(id);
    if exporting() {
        let context = tracing::Span::current().context();
        let span = context.span();
        let current = span.span_context();
        if current.is_valid() && current.trace_id().to_bytes() == trace_id {
            return TraceParent {
                trace_id,
                parent_id: current.span_id().to_bytes(),
                sampled: current.is_sampled(),
            };
        }
    }
    let mut parent_id: [u8; 8] = rand::random();
    parent_id[0] |= 1; // never all zero
    TraceParent {
        trace_id,
        parent_id,
        sampled: true,
    }
}

fn root_span_id(id: Uuid) -> [u8; 8] {
    let mut root = [0u8; 8];
    root.copy_from_slice(&id.as_bytes()[8..]);
    root[0] |= 1;
    root
}

/// Keeps the span exporter running; dropping it flushes what is buffered.
pub struct Exporter(Option<SdkTracerProvider>);

impl Drop for Exporter {
    fn drop(&mut self) {
        if let Some(provider) = self.0.take() {
            if let Err(e) = provider.shutdown() {
                eprintln!("docstream: spans not flushed: {e}");
            }
        }
    }
}

/// The OpenTelemetry layer for `tracing`, when `OTEL_EXPORTER_OTLP_ENDPOINT`
/// is set: spans go over OTLP/HTTP (protobuf) as `service` (or
/// `OTEL_SERVICE_NAME`), batched on the exporter's own thread. The returned
/// [`Exporter`] must live until the process ends.
pub fn init<S>(
    service: &str,
) -> Result<
    (
        Option<tracing_opentelemetry::OpenTelemetryLayer<S, opentelemetry_sdk::trace::Tracer>>,
        Exporter,
    ),
    String,
>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").unwrap_or_default();
    if endpoint.trim().is_empty() {
        let _ = EXPORTING.set(false);
        return Ok((None, Exporter(None)));
    }
    crate::outbound::install_tls_provider();
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .map_err(|e| format!("OTEL_EXPORTER_OTLP_ENDPOINT={endpoint}: {e}"))?;
    let name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| service.to_owned());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(name)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("docstream");
    let _ = EXPORTING.set(true);
    let layer = tracing_opentelemetry::layer().with_tracer(tracer);
    Ok((Some(layer), Exporter(Some(provider))))
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut text = String::with_capacity(2 * bytes.len());
    for b in bytes {
        text.push(DIGITS[usize::from(b >> 4)] as char);
        text.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    text
}

fn hex_bytes<const N: usize>(text: &str) -> Option<[u8; N]> {
    if text.len() != 2 * N || !text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut bytes = [0u8; N];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_reads_back_and_bad_ones_are_ignored() {
        let header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let parsed = TraceParent::parse(header).unwrap();
        assert_eq!(parsed.header(), header);
        assert!(parsed.sampled);
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
        // A later version may add fields after the four it shares.
        assert!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-x")
                .is_some()
        );
    }

    #[test]
    fn a_jobs_records_share_its_trace_id() {
        let id = Uuid::now_v7();
        let (a, b) = (traceparent_for(id), traceparent_for(id));
        assert_eq!(a.trace_id, *id.as_bytes());
        assert_eq!(a.trace_id, b.trace_id);
        assert_ne!(a.parent_id, b.parent_id);
        assert_eq!(TraceParent::parse(&a.header()), Some(a));
    }
}
