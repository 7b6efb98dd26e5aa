//! WeChat message push crypto (WXBizMsgCrypt), pure: the signatures that authenticate a
//! push and the AES-256-CBC envelope of safe mode.
//!
//! - `signature = hex(sha1(sorted(token, timestamp, nonce)))`: URL verification and
//!   plain pushes. It covers no body.
//! - `msg_signature = hex(sha1(sorted(token, timestamp, nonce, Encrypt)))`: safe and
//!   compatible mode; the only check that covers the ciphertext, so it is verified
//!   before anything is decrypted or parsed.
//! - `Encrypt = base64(AES-256-CBC(key, iv = key[..16], pkcs7_32(random16 ‖ len_be32 ‖
//!   msg ‖ appid)))` with `key = base64(EncodingAESKey + "=")`. Padding is PKCS#7 to a
//!   32-byte block (values 1..=32), not AES's 16; the trailing appid must be ours.
//!
//! Signatures are compared in constant time. Every failure is one error kind, with no
//! detail an attacker could use as an oracle.

use aes::cipher::{BlockDecryptMut, BlockEncryptMut, KeyIvInit, block_padding::NoPadding};
use base64::Engine;
use sha1::{Digest, Sha1};

use crate::secrets::Secret;

type Decryptor = cbc::Decryptor<aes::Aes256>;
type Encryptor = cbc::Encryptor<aes::Aes256>;

/// WeChat pads to 32-byte blocks.
const PAD_BLOCK: usize = 32;

/// Why a push's crypto was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PushCryptoError {
    /// The EncodingAESKey is not 43 base64 characters (32 bytes).
    #[error("the EncodingAESKey must be 43 base64 characters")]
    Key,
    /// The ciphertext is not base64, not whole blocks, badly padded or framed, or
    /// names another appid.
    #[error("the encrypted message could not be opened")]
    Envelope,
}

/// The push settings of one mini-program: its token, AES key and appid.
#[derive(Clone)]
pub struct PushCrypto {
    token: Secret,
    /// None in plain mode: signatures only.
    key: Option<[u8; 32]>,
    appid: String,
}

impl std::fmt::Debug for PushCrypto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PushCrypto")
            .field("appid", &self.appid)
            .finish_non_exhaustive()
    }
}

/// `hex(sha1(concat(sorted(parts))))`.
pub fn sha1_sorted(parts: &[&str]) -> String {
    let mut sorted = parts.to_vec();
    sorted.sort_unstable();
    let mut hasher = Sha1::new();
    for part in sorted {
        hasher.update(part.as_bytes());
    }
    hex::encode(hasher.finalize())
}

/// Equal in time that depends only on the lengths.
pub(crate) fn same(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

impl PushCrypto {
    pub fn new(
        token: Secret,
        encoding_aes_key: &str,
        appid: &str,
    ) -> Result<Self, PushCryptoError> {
        let mut crypto = Self::signatures_only(token, appid);
        crypto.key = Some(Self::key(encoding_aes_key)?);
        Ok(crypto)
    }

    /// Plain mode: signatures, no envelope (decrypting fails).
    pub fn signatures_only(token: Secret, appid: &str) -> Self {
        Self {
            token,
            key: None,
            appid: appid.to_string(),
        }
    }

    fn key(encoding_aes_key: &str) -> Result<[u8; 32], PushCryptoError> {
        if encoding_aes_key.len() != 43 {
            return Err(PushCryptoError::Key);
        }
        // The console makes 43 random characters, so the last one's two spare bits may
        // be set: decode as WeChat's own SDKs do, ignoring them.
        let lenient = base64::engine::GeneralPurpose::new(
            &base64::alphabet::STANDARD,
            base64::engine::GeneralPurposeConfig::new().with_decode_allow_trailing_bits(true),
        );
        let bytes = lenient
            .decode(format!("{encoding_aes_key}="))
            .map_err(|_| PushCryptoError::Key)?;
        bytes.try_into().map_err(|_| PushCryptoError::Key)
    }

    /// The `signature` of a URL verification or a plain push.
    pub fn signature(&self, timestamp: &str, nonce: &str) -> String {
        sha1_sorted(&[self.token.expose(), timestamp, nonce])
    }

    /// Whether `signature` is this token's over `timestamp` and `nonce`.
    pub fn verify_signature(&self, timestamp: &str, nonce: &str, signature: &str) -> bool {
        same(
            &self.signature(timestamp, nonce),
            &signature.to_ascii_lowercase(),
        )
    }

    /// The `msg_signature` over a ciphertext.
    pub fn msg_signature(&self, timestamp: &str, nonce: &str, encrypt: &str) -> String {
        sha1_sorted(&[self.token.expose(), timestamp, nonce, encrypt])
    }

    /// Whether `msg_signature` is this token's over `timestamp`, `nonce` and `encrypt`.
    pub fn verify_msg_signature(
        &self,
        timestamp: &str,
        nonce: &str,
        encrypt: &str,
        msg_signature: &str,
    ) -> bool {
        same(
            &self.msg_signature(timestamp, nonce, encrypt),
            &msg_signature.to_ascii_lowercase(),
        )
    }

    /// The message inside `encrypt` (call only once its `msg_signature` verified).
    pub fn decrypt(&self, encrypt: &str) -> Result<String, PushCryptoError> {
        let key = self.key.ok_or(PushCryptoError::Key)?;
        let mut data = base64::engine::general_purpose::STANDARD
            .decode(encrypt)
            .map_err(|_| PushCryptoError::Envelope)?;
        if data.is_empty() || data.len() % PAD_BLOCK != 0 {
            return Err(PushCryptoError::Envelope);
        }
        let plain = Decryptor::new(&key.into(), key[..16].into())
            .decrypt_padded_mut::<NoPadding>(&mut data)
            .map_err(|_| PushCryptoError::Envelope)?;
        let pad = usize::from(*plain.last().ok_or(PushCryptoError::Envelope)?);
        if !(1..=PAD_BLOCK).contains(&pad)
            || pad > plain.len()
            || plain[plain.len() - pad..]
                .iter()
                .any(|b| usize::from(*b) != pad)
        {
            return Err(PushCryptoError::Envelope);
        }
        let framed = &plain[..plain.len() - pad];
        let length_bytes: [u8; 4] = framed
            .get(16..20)
            .and_then(|b| b.try_into().ok())
            .ok_or(PushCryptoError::Envelope)?;
        let length = usize::try_from(u32::from_be_bytes(length_bytes))
            .map_err(|_| PushCryptoError::Envelope)?;
        let end = 20usize
            .checked_add(length)
            .filter(|end| *end <= framed.len())
            .ok_or(PushCryptoError::Envelope)?;
        if !same(
            std::str::from_utf8(&framed[end..]).map_err(|_| PushCryptoError::Envelope)?,
            &self.appid,
        ) {
            return Err(PushCryptoError::Envelope);
        }
        String::from_utf8(framed[20..end].to_vec()).map_err(|_| PushCryptoError::Envelope)
    }

    /// `msg` sealed as WeChat seals a push, with these 16 random bytes first (empty
    /// without a key).
    pub fn encrypt(&self, msg: &str, random: &[u8; 16]) -> String {
        let Some(key) = self.key else {
            return String::new();
        };
        let mut plain = Vec::with_capacity(20 + msg.len() + self.appid.len() + PAD_BLOCK);
        plain.extend_from_slice(random);
        plain.extend_from_slice(&u32::try_from(msg.len()).unwrap_or(u32::MAX).to_be_bytes());
        plain.extend_from_slice(msg.as_bytes());
        plain.extend_from_slice(self.appid.as_bytes());
        let pad = PAD_BLOCK - plain.len() % PAD_BLOCK;
        plain.extend(std::iter::repeat_n(
            u8::try_from(pad).unwrap_or(PAD_BLOCK as u8),
            pad,
        ));
        let length = plain.len();
        let sealed = Encryptor::new(&key.into(), key[..16].into())
            .encrypt_padded_mut::<NoPadding>(&mut plain, length)
            .map(<[u8]>::to_vec)
            .unwrap_or_default();
        base64::engine::general_purpose::STANDARD.encode(sealed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn official() -> PushCrypto {
        PushCrypto::new(Secret::new("AAAAA"), &"A".repeat(43), "wxba5fad812f8e6fb9")
            .expect("the official key")
    }

    #[test]
    fn the_official_signature_vectors_verify() {
        let c = official();
        // URL verification.
        assert_eq!(
            c.signature("1714036504", "1514711492"),
            "f464b24fc39322e44b38aa78f5edd27bd1441696"
        );
        assert!(c.verify_signature(
            "1714036504",
            "1514711492",
            "f464b24fc39322e44b38aa78f5edd27bd1441696"
        ));
        // A plain push.
        assert!(c.verify_signature(
            "1714037059",
            "486452656",
            "899cf89e464efb63f54ddac96b0a0a235f53aa78"
        ));
        assert!(!c.verify_signature(
            "1714037059",
            "486452657",
            "899cf89e464efb63f54ddac96b0a0a235f53aa78"
        ));
        assert!(!c.verify_signature("1714037059", "486452656", ""));
    }

    #[test]
    fn the_official_encrypted_reply_vector_seals_signs_and_opens() {
        let c = official();
        let random: [u8; 16] = *b"707722b803182950";
        let msg = r#"{"demo_resp":"good luck"}"#;
        let encrypt = c.encrypt(msg, &random);
        assert_eq!(
            encrypt,
            "ELGduP2YcVatjqIS+eZbp80MNLoAUWvzzyJxgGzxZO/5sAvd070Bs6qrLARC9nVHm48Y4hyRbtzve1L32tmxSQ=="
        );
        assert_eq!(
            c.msg_signature("1713424427", "415670741", &encrypt),
            "1b9339964ed2e271e7c7b6ff2b0ef902fc94dea1"
        );
        assert!(c.verify_msg_signature(
            "1713424427",
            "415670741",
            &encrypt,
            "1B9339964ED2E271E7C7B6FF2B0EF902FC94DEA1"
        ));
        assert_eq!(c.decrypt(&encrypt).as_deref(), Ok(msg));
    }

    #[test]
    fn long_and_multibyte_messages_round_trip_through_32_byte_padding() {
        let c = official();
        for n in [0usize, 1, 11, 12, 13, 44, 45, 100, 1000] {
            let msg: String = "订阅消息".chars().cycle().take(n).collect();
            let sealed = c.encrypt(&msg, &[7; 16]);
            assert_eq!(c.decrypt(&sealed).as_deref(), Ok(msg.as_str()), "{n}");
        }
    }

    #[test]
    fn bad_envelopes_are_refused() {
        let c = official();
        let good = c.encrypt("hello", &[1; 16]);
        let other_app = PushCrypto::new(Secret::new("AAAAA"), &"A".repeat(43), "wxother")
            .expect("key")
            .encrypt("hello", &[1; 16]);
        let other_key =
            PushCrypto::new(Secret::new("AAAAA"), &"B".repeat(43), "wxba5fad812f8e6fb9")
                .expect("key")
                .encrypt("hello", &[1; 16]);
        let mut bytes = base64::engine::general_purpose::STANDARD
            .decode(&good)
            .expect("base64");
        bytes.truncate(bytes.len() - 16);
        let half_block = base64::engine::general_purpose::STANDARD.encode(&bytes);
        for bad in [
            "",
            "not base64!",
            half_block.as_str(),
            other_app.as_str(),
            other_key.as_str(),
        ] {
            assert_eq!(c.decrypt(bad), Err(PushCryptoError::Envelope), "{bad}");
        }
        for key in ["", "short", &"A".repeat(44), &"*".repeat(43)] {
            assert_eq!(
                PushCrypto::new(Secret::new("t"), key, "wx").err(),
                Some(PushCryptoError::Key),
                "{key}"
            );
        }
    }

    /// `plain` (whole 32-byte blocks) sealed with the official key, unpadded.
    fn seal_raw(mut plain: Vec<u8>) -> String {
        let key = [0u8; 32]; // base64 of 43×'A' is all zero bytes
        let length = plain.len();
        let sealed = Encryptor::new(&key.into(), key[..16].into())
            .encrypt_padded_mut::<NoPadding>(&mut plain, length)
            .expect("whole blocks")
            .to_vec();
        base64::engine::general_purpose::STANDARD.encode(sealed)
    }

    #[test]
    fn bad_padding_and_framing_are_refused() {
        let c = official();
        // A 64-byte frame ending in `pad_len` bytes of `pad`, its message "hi" grown by
        // 'x' to fill the rest — nothing outside the message, so only the padding check
        // can refuse a bad pad. `len` overrides the length field.
        let frame = |len: Option<u32>, pad: u8, pad_len: usize| {
            let appid = b"wxba5fad812f8e6fb9";
            let message_len = 64 - 16 - 4 - appid.len() - pad_len;
            let mut message = b"hi".to_vec();
            message.resize(message_len, b'x');
            let mut p = vec![b'r'; 16];
            p.extend_from_slice(
                &len.unwrap_or(u32::try_from(message_len).unwrap_or(0))
                    .to_be_bytes(),
            );
            p.extend_from_slice(&message);
            p.extend_from_slice(appid);
            p.extend(std::iter::repeat_n(pad, pad_len));
            p
        };
        // The control: a well-formed frame opens, and so does one with a longer message.
        assert_eq!(
            c.decrypt(&seal_raw(frame(None, 24, 24))).as_deref(),
            Ok("hi")
        );
        assert_eq!(
            c.decrypt(&seal_raw(frame(None, 4, 4))).map(|m| m.len()),
            Ok(22)
        );
        // None of these may: framing and padding are exact.
        for (what, plain) in [
            ("pad 0", frame(None, 0, 1)),
            ("pad 33", frame(None, 33, 1)),
            ("pad bytes disagree", {
                let mut p = frame(None, 4, 4);
                p[61] = 3;
                p
            }),
            ("length past the end", frame(Some(500), 4, 4)),
            (
                "bytes between the message and the appid",
                frame(Some(2), 4, 4),
            ),
        ] {
            assert_eq!(
                c.decrypt(&seal_raw(plain)),
                Err(PushCryptoError::Envelope),
                "{what}"
            );
        }
    }

    #[test]
    fn secrets_stay_out_of_debug_output() {
        let printed = format!("{:?}", official());
        assert!(!printed.contains("AAAAA"));
    }
}
