//! What a file is, from its first bytes: the client's `Content-Type` is a
//! claim, the bytes are the evidence.

use serde::Serialize;

/// The kinds of file docstream takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub enum FileType {
    /// `application/pdf`.
    #[serde(rename = "application/pdf")]
    Pdf,
    /// `image/png`.
    #[serde(rename = "image/png")]
    Png,
    /// `image/jpeg`.
    #[serde(rename = "image/jpeg")]
    Jpeg,
    /// `image/tiff`.
    #[serde(rename = "image/tiff")]
    Tiff,
    /// `text/plain`: UTF-8 without control characters but whitespace.
    #[serde(rename = "text/plain")]
    Text,
}

impl FileType {
    /// Every kind, in the order they are listed.
    pub const ALL: [FileType; 5] = [Self::Pdf, Self::Png, Self::Jpeg, Self::Tiff, Self::Text];

    /// The media type.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pdf => "application/pdf",
            Self::Png => "image/png",
            Self::Jpeg => "image/jpeg",
            Self::Tiff => "image/tiff",
            Self::Text => "text/plain",
        }
    }

    /// The kind a media type names (parameters such as `; charset=utf-8`
    /// ignored), if docstream takes it.
    pub fn named(media_type: &str) -> Option<Self> {
        let essence = media_type.split(';').next().unwrap_or_default().trim();
        Self::ALL
            .into_iter()
            .find(|kind| kind.as_str().eq_ignore_ascii_case(essence))
    }

    /// What `bytes` are, or `None` for anything docstream does not take.
    /// The binary formats by their signature; text when the bytes are UTF-8
    /// with no control character but tab, line feed, form feed and carriage
    /// return (a binary format docstream does not know has some).
    pub fn sniff(bytes: &[u8]) -> Option<Self> {
        const SIGNATURES: [(&[u8], FileType); 5] = [
            (b"%PDF-", FileType::Pdf),
            (b"\x89PNG\r\n\x1a\n", FileType::Png),
            (b"\xff\xd8\xff", FileType::Jpeg),
            (b"II*\x00", FileType::Tiff),
            (b"MM\x00*", FileType::Tiff),
        ];
        if let Some((_, kind)) = SIGNATURES.iter().find(|(sig, _)| bytes.starts_with(sig)) {
            return Some(*kind);
        }
        let control =
            |b: &u8| b.is_ascii_control() && !matches!(b, b'\t' | b'\n' | b'\x0c' | b'\r');
        let text = !bytes.iter().any(control) && std::str::from_utf8(bytes).is_ok();
        text.then_some(Self::Text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_is_known_by_its_bytes() {
        let cases: [(&[u8], Option<FileType>); 9] = [
            (b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n", Some(FileType::Pdf)),
            (b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR", Some(FileType::Png)),
            (b"\xff\xd8\xff\xe0\0\x10JFIF", Some(FileType::Jpeg)),
            (b"II*\x00\x08\0\0\0", Some(FileType::Tiff)),
            (b"MM\x00*\0\0\0\x08", Some(FileType::Tiff)),
            ("Invoice n\u{b0} 7\n".as_bytes(), Some(FileType::Text)),
            (b"PK\x03\x04 a zip", None),
            (b"text with a \0 NUL", None),
            (b"\xc3\x28 not UTF-8", None),
        ];
        for (bytes, kind) in cases {
            assert_eq!(FileType::sniff(bytes), kind, "{bytes:?}");
        }
    }

    #[test]
    fn a_media_type_names_a_kind_whatever_its_parameters() {
        assert_eq!(FileType::named("application/PDF"), Some(FileType::Pdf));
        assert_eq!(
            FileType::named("text/plain; charset=utf-8"),
            Some(FileType::Text)
        );
        assert_eq!(FileType::named("application/zip"), None);
    }
}
