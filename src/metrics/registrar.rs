//! Registering a metric: the registry, which remembers what was registered
//! on it (the manual's table of metrics is made of that), the helpers every
//! area's struct registers its series with, and the buckets they share.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry,
};

/// Buckets of a stage's work (an extraction, a bbox refinement).
pub(super) const STAGE_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

/// Buckets of one request to a dependency (a broker, a webhook, the pool).
pub(super) const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// Creates, at 0, the series of `vec` with each of `values`. A series that
/// first appears at 1 has no earlier sample, so `increase()` and `rate()`
/// miss its first event (an alert on the first forced shutdown would never
/// fire); created at start-up, each event is an increase. So every series
/// whose labels are a fixed set starts here; series labelled by a topic,
/// route or extractor start with their first use instead.
pub(super) fn at_zero(vec: &IntCounterVec, values: &[&[&str]]) {
    for labels in values {
        vec.with_label_values(labels);
    }
}

/// An [`IntCounterVec`], registered.
pub(super) fn counter_vec(
    registry: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntCounterVec {
    register(registry, IntCounterVec::new(Opts::new(name, help), labels))
}

/// An [`IntGaugeVec`], registered.
pub(super) fn gauge_vec(
    registry: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
) -> IntGaugeVec {
    register(registry, IntGaugeVec::new(Opts::new(name, help), labels))
}

/// A [`prometheus::GaugeVec`] (floating point), registered.
pub(super) fn float_gauge_vec(
    registry: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::GaugeVec {
    register(
        registry,
        prometheus::GaugeVec::new(Opts::new(name, help), labels),
    )
}

/// A [`prometheus::CounterVec`] (floating point), registered.
pub(super) fn float_counter_vec(
    registry: &Registrar,
    name: &str,
    help: &str,
    labels: &[&str],
) -> prometheus::CounterVec {
    register(
        registry,
        prometheus::CounterVec::new(Opts::new(name, help), labels),
    )
}

/// An [`IntCounter`], registered.
pub(super) fn counter(registry: &Registrar, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::new(name, help))
}

/// An [`IntGauge`], registered.
pub(super) fn gauge(registry: &Registrar, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::new(name, help))
}

/// A [`HistogramVec`] with `buckets`, registered.
pub(super) fn histogram_vec(
    registry: &Registrar,
    name: &str,
    help: &str,
    buckets: &[f64],
    labels: &[&str],
) -> HistogramVec {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(registry, HistogramVec::new(opts, labels))
}

/// A [`Histogram`] with `buckets`, registered.
pub(super) fn histogram(
    registry: &Registrar,
    name: &str,
    help: &str,
    buckets: &[f64],
) -> Histogram {
    let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
    register(registry, Histogram::with_opts(opts))
}

/// Registers `metric` (created by `new`) on `registry` and returns it.
pub(super) fn register<M>(registry: &Registrar, metric: prometheus::Result<M>) -> M
where
    M: prometheus::core::Collector + Clone + 'static,
{
    let metric = metric.expect("valid metric");
    registry.add(Box::new(metric.clone()));
    metric
}

/// The process's registry, which also remembers what was registered on it:
/// the manual's table of metrics is made of that ([`Metrics::described`]).
pub(super) struct Registrar {
    pub(super) registry: Registry,
    pub(super) described: std::sync::Mutex<Vec<DescribedMetric>>,
}

/// One metric as the manual's table lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedMetric {
    /// Its name.
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    /// The labels its series carry.
    pub labels: Vec<String>,
    /// What it counts: its help text.
    pub help: String,
}

impl Registrar {
    pub(super) fn new() -> Self {
        Self {
            registry: Registry::new(),
            described: Default::default(),
        }
    }

    /// Registers `collector`, and describes each metric it collects.
    pub(super) fn add(&self, collector: Box<dyn prometheus::core::Collector>) {
        let kinds: Vec<(String, &'static str)> = collector
            .collect()
            .iter()
            .map(|family| (family.name().to_owned(), kind_of(family.get_field_type())))
            .collect();
        let described = collector.desc().into_iter().map(|desc| DescribedMetric {
            name: desc.fq_name.clone(),
            kind: kinds
                .iter()
                .find(|(name, _)| *name == desc.fq_name)
                .map_or("gauge", |(_, kind)| kind),
            labels: desc.variable_labels.clone(),
            help: desc.help.clone(),
        });
        let mut list = self.described.lock().expect("not poisoned");
        list.extend(described);
        drop(list);
        self.registry.register(collector).expect("unique metric");
    }
}

fn kind_of(kind: prometheus::proto::MetricType) -> &'static str {
    use prometheus::proto::MetricType;
    match kind {
        MetricType::COUNTER => "counter",
        MetricType::HISTOGRAM => "histogram",
        MetricType::SUMMARY => "summary",
        _ => "gauge",
    }
}
