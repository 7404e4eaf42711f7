//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256>`
//! over `"{webhook-id}.{webhook-timestamp}.{body}"`, keyed with the job's
//! tenant's secret, so a receiver's stock Standard Webhooks library verifies
//! them. During a secret rotation the header carries one signature per active
//! secret, separated by spaces, as the spec allows: a receiver that knows
//! either secret accepts the delivery.

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Signs webhook bodies with one secret.
#[derive(Clone)]
pub struct Signer {
    key: Vec<u8>,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the key.
        f.debug_struct("Signer").finish_non_exhaustive()
    }
}

impl Signer {
    /// A signer for `secret`: `whsec_` and base64 (the Standard Webhooks form).
    pub fn new(secret: &str) -> Result<Self, String> {
        let encoded = secret
            .strip_prefix("whsec_")
            .ok_or("a webhook secret starts with whsec_")?;
        let key = STANDARD
            .decode(encoded)
            .map_err(|e| format!("the part after whsec_ is not base64: {e}"))?;
        if key.is_empty() {
            return Err("the key is empty".into());
        }
        Ok(Self { key })
    }

    /// This secret's signature of one attempt: `v1,<base64>`.
    pub fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> String {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.key).expect("HMAC takes keys of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        format!("v1,{}", STANDARD.encode(mac.finalize().into_bytes()))
    }
}

/// The `webhook-signature` header of one attempt: a signature per secret in
/// `secrets` (the current one first), separated by spaces.
pub fn signature_header(
    secrets: &[String],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<String, String> {
    if secrets.is_empty() {
        return Err("the job's tenant has no webhook secret".into());
    }
    let mut signatures = Vec::with_capacity(secrets.len());
    for secret in secrets {
        signatures.push(Signer::new(secret)?.sign(id, timestamp, body));
    }
    Ok(signatures.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const VECTOR_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

    #[test]
    fn signatures_reproduce_the_standard_webhooks_test_vector() {
        // The vector the Standard Webhooks reference libraries test against:
        // a receiver's library accepts what reproduces it.
        let signer = Signer::new(VECTOR_SECRET).unwrap();
        let signature = signer.sign(
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn a_rotation_signs_with_both_secrets_the_current_first() {
        let other = crate::domain::new_webhook_secret();
        let secrets = [other.clone(), VECTOR_SECRET.to_owned()];
        let header = signature_header(
            &secrets,
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            br#"{"test": 2432232314}"#,
        )
        .unwrap();
        let parts: Vec<&str> = header.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[1], "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
        let current = Signer::new(&other).unwrap();
        assert_eq!(
            parts[0],
            current.sign(
                "msg_p5jXN8AQM9LWM0D4loKWxJek",
                1_614_265_330,
                br#"{"test": 2432232314}"#
            )
        );
        assert!(signature_header(&[], "id", 1, b"").is_err());
    }

    #[test]
    fn secrets_are_checked_and_never_printed() {
        assert!(Signer::new("").is_err());
        assert!(Signer::new("a raw key").is_err());
        assert!(Signer::new("whsec_not base64!").is_err());
        assert!(Signer::new("whsec_").is_err());
        let signer = Signer::new(VECTOR_SECRET).unwrap();
        assert!(!format!("{signer:?}").contains("MfKQ"));
    }
}
