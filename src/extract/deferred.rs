//! Deferred results: an extractor may answer a call with 202 and post the
//! result later to `POST /v1/extractions/{id}/result`. The call tells it where
//! ([`Callback`]), with a token that names the job and the attempt and is
//! signed with the deployment's callback secret, so only the service that got
//! the call can end that attempt, and only that attempt.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, KeyInit, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use uuid::Uuid;

/// Where and how to post a deferred result; part of the call's body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Callback {
    /// `POST` the result here.
    pub url: String,
    /// Send it as `Authorization: Bearer <token>`.
    pub token: String,
}

impl Callback {
    /// The callback of attempt `attempt` of job `id`, on the API at `public_url`.
    pub fn new(public_url: &str, secret: &str, id: Uuid, attempt: i32) -> Self {
        Self {
            url: format!("{public_url}/v1/extractions/{id}/result"),
            token: format!(
                "{attempt}.{}",
                URL_SAFE_NO_PAD.encode(mac(secret, id, attempt))
            ),
        }
    }
}

/// The attempt `token` was issued for on job `id`, if `secret` signed it.
pub fn verify(secret: &str, id: Uuid, token: &str) -> Option<i32> {
    let (attempt, signature) = token.split_once('.')?;
    let attempt: i32 = attempt.parse().ok().filter(|a| *a >= 1)?;
    signed_by(secret, &message(id, attempt), signature).then_some(attempt)
}

fn message(id: Uuid, attempt: i32) -> String {
    format!("docstream-result:{id}:{attempt}")
}

fn mac(secret: &str, id: Uuid, attempt: i32) -> Vec<u8> {
    sign(secret, &message(id, attempt))
}

fn keyed(secret: &str) -> Hmac<Sha256> {
    Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("HMAC takes keys of any length")
}

/// HMAC-SHA256 of `message` under `secret`: what the deployment's tokens
/// and signed URLs carry (base64url without padding on the wire).
pub fn sign(secret: &str, message: &str) -> Vec<u8> {
    let mut mac = keyed(secret);
    mac.update(message.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// Whether `signature` (base64url) is [`sign`] of `message` under
/// `secret`, compared in constant time.
pub fn signed_by(secret: &str, message: &str, signature: &str) -> bool {
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else {
        return false;
    };
    let mut check = keyed(secret);
    check.update(message.as_bytes());
    check.verify_slice(&signature).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "a-callback-secret-for-tests";

    #[test]
    fn a_token_ends_only_its_own_attempt_of_its_own_job() {
        let id = Uuid::new_v4();
        let callback = Callback::new("https://ds.example", SECRET, id, 3);
        assert_eq!(
            callback.url,
            format!("https://ds.example/v1/extractions/{id}/result")
        );
        assert_eq!(verify(SECRET, id, &callback.token), Some(3));
        assert_eq!(verify(SECRET, Uuid::new_v4(), &callback.token), None);
        assert_eq!(verify("another-secret-of-16b", id, &callback.token), None);
        let forged = callback.token.replacen('3', "4", 1);
        assert_eq!(verify(SECRET, id, &forged), None);
        assert_eq!(verify(SECRET, id, "3"), None);
        assert_eq!(verify(SECRET, id, "0.abc"), None);
    }
}
