//! The crypto behind session tokens: HS256 and nothing else, as a `jsonwebtoken`
//! provider. `jsonwebtoken`'s own backends link every algorithm it knows (RSA, ECDSA,
//! EdDSA: about 0.5 MB of each function's binary) while onegrant only ever signs and
//! verifies HS256; any other algorithm is refused here as well as by the validation.

use hmac::{Hmac, KeyInit, Mac};
use jsonwebtoken::crypto::{CryptoProvider, JwtSigner, JwtVerifier, KeyUtils};
use jsonwebtoken::errors::{ErrorKind, Result};
use jsonwebtoken::signature::{Error as SignatureError, Signer, Verifier};
use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, EncodingKey};
use sha2_jwt::Sha256;

type HmacSha256 = Hmac<Sha256>;

struct Hs256Signer(HmacSha256);

impl Signer<Vec<u8>> for Hs256Signer {
    fn try_sign(&self, msg: &[u8]) -> std::result::Result<Vec<u8>, SignatureError> {
        let mut mac = self.0.clone();
        mac.update(msg);
        Ok(mac.finalize().into_bytes().to_vec())
    }
}

impl JwtSigner for Hs256Signer {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

struct Hs256Verifier(HmacSha256);

impl Verifier<Vec<u8>> for Hs256Verifier {
    fn verify(&self, msg: &[u8], signature: &Vec<u8>) -> std::result::Result<(), SignatureError> {
        let mut mac = self.0.clone();
        mac.update(msg);
        // Constant-time comparison.
        mac.verify_slice(signature)
            .map_err(|_| SignatureError::new())
    }
}

impl JwtVerifier for Hs256Verifier {
    fn algorithm(&self) -> Algorithm {
        Algorithm::HS256
    }
}

fn signer(algorithm: &Algorithm, key: &EncodingKey) -> Result<Box<dyn JwtSigner>> {
    if *algorithm != Algorithm::HS256 || key.family() != AlgorithmFamily::Hmac {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    let mac =
        HmacSha256::new_from_slice(key.as_bytes()).map_err(|_| ErrorKind::InvalidKeyFormat)?;
    Ok(Box::new(Hs256Signer(mac)))
}

fn verifier(algorithm: &Algorithm, key: &DecodingKey) -> Result<Box<dyn JwtVerifier>> {
    if *algorithm != Algorithm::HS256 || key.family() != AlgorithmFamily::Hmac {
        return Err(ErrorKind::InvalidAlgorithm.into());
    }
    let mac = HmacSha256::new_from_slice(key.try_get_as_bytes()?)
        .map_err(|_| ErrorKind::InvalidKeyFormat)?;
    Ok(Box::new(Hs256Verifier(mac)))
}

static PROVIDER: CryptoProvider = CryptoProvider {
    signer_factory: signer,
    verifier_factory: verifier,
    // No JWKs: session tokens are signed with a shared secret.
    key_utils: KeyUtils::new_unimplemented(),
};

/// Makes HS256 the process's token crypto; idempotent. Called before any token is
/// signed or verified ([`super::Sessions::new`]); tests that sign tokens of their own
/// call it too.
pub fn install() {
    // An error means a provider is installed already: this one (there is no other).
    let _ = PROVIDER.install_default();
}
