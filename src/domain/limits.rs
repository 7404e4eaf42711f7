//! The bounds a request must keep and a result may reach. Each is a setting
//! (`config`); these are the values the checks read, so every intake and
//! every extractor apply the same ones.

/// How large a request may be, part by part. The body limit bounds the whole;
/// these bound what a small body could still make expensive (many fields, a
/// huge compiled pattern, deep metadata).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// Most field specs.
    pub fields: usize,
    /// Longest field name, in bytes.
    pub field_name_bytes: usize,
    /// Longest pattern, in bytes.
    pub pattern_bytes: usize,
    /// Largest compiled pattern (regex size limit and lazy-DFA cache), in bytes.
    pub pattern_program_bytes: usize,
    /// Longest anchor, in bytes.
    pub anchor_bytes: usize,
    /// Most pages.
    pub pages: usize,
    /// Most words on one page.
    pub words_per_page: usize,
    /// Most words (whitespace-separated) in a text document.
    pub text_words: usize,
    /// Largest `metadata`, as compact JSON.
    pub metadata_bytes: usize,
    /// Deepest nesting of `metadata`.
    pub json_depth: usize,
    /// Longest `webhook_url`, in bytes.
    pub url_bytes: usize,
}

/// How large an extraction's result may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResultLimits {
    /// Largest value of one field, as JSON.
    pub field_bytes: usize,
    /// Largest whole result, as JSON.
    pub total_bytes: usize,
}

impl RequestLimits {
    /// The defaults of the settings, for tests and tools that have no settings.
    pub const DEFAULT: Self = Self {
        fields: 100,
        field_name_bytes: 128,
        pattern_bytes: 512,
        pattern_program_bytes: 1 << 20,
        anchor_bytes: 256,
        pages: 1_000,
        words_per_page: 10_000,
        text_words: 200_000,
        metadata_bytes: 16 * 1024,
        json_depth: 32,
        url_bytes: 8 * 1024,
    };
}

impl ResultLimits {
    /// The defaults of the settings.
    pub const DEFAULT: Self = Self {
        field_bytes: 64 * 1024,
        total_bytes: 1 << 20,
    };
}
