//! A received record, detached from the consumer that read it.

/// A received record, detached from the consumer.
#[derive(Debug, Clone)]
pub struct Record {
    /// Source topic.
    pub topic: String,
    /// Source partition.
    pub partition: i32,
    /// Offset within the partition.
    pub offset: i64,
    /// Record key.
    pub key: Option<Vec<u8>>,
    /// Record value.
    pub payload: Option<Vec<u8>>,
    /// Record headers, in order (a job's records carry `traceparent`).
    pub headers: Vec<(String, Vec<u8>)>,
}

impl Record {
    /// The value of the first header named `name`.
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_slice())
    }

    /// The record's W3C trace context, if it has a valid one.
    pub fn traceparent(&self) -> Option<crate::trace::TraceParent> {
        let value = std::str::from_utf8(self.header(crate::trace::TRACEPARENT)?).ok()?;
        crate::trace::TraceParent::parse(value)
    }
}
