"""Every purpose label and signature context of the protocol, in one place.

Changing any value here is a protocol version bump: old and new peers will no longer agree.
"""

PROTOCOL_VERSION = "clinograph/v1"

# Signature contexts (prefixed to the exact bytes that are signed).
SIG_MESSAGE = b"clinograph/v1/sig/message"
SIG_AUDIT_ENTRY = b"clinograph/v1/sig/audit-entry"
SIG_AUDIT_HEAD = b"clinograph/v1/sig/audit-head"
SIG_ROUND_KEYS = b"clinograph/v1/sig/round-keys"  # masked/1 only; retired in masked/2 (the envelope signs the keys): never reuse
SIG_PRIVACY_LEDGER = b"clinograph/v1/sig/privacy-ledger"  # a hospital signs its own DP ledger file

# HKDF info labels.
KDF_PAIRWISE_MASK = b"clinograph/v1/pairwise-mask"
KDF_SELF_MASK = b"clinograph/v1/self-mask"
KDF_SHARE_ENCRYPTION = b"clinograph/v1/share-encryption"
KDF_CKKS_KEY_WRAP = b"clinograph/v1/ckks-key-wrap"

# Masking (SecAgg+) -- appended for secure/masking.
HASH_NEIGHBOUR_GRAPH = b"clinograph/v1/masking/neighbour-graph"
KDF_SHARE_ENCRYPTION_DIRECTED = b"clinograph/v1/masking/share-encryption-directed"

# Audit log (secure/audit) -- domain-separated entry hashing (RFC 6962 style prefixes).
HASH_AUDIT_ENTRY = b"clinograph/v1/hash/audit-entry"

# CKKS (secure/ckks) -- appended for the ckks mode.
MAC_CKKS_CONTRIBUTOR_TAG = b"clinograph/v1/ckks/contributor-tag"
HASH_CKKS_CONTEXT = b"clinograph/v1/ckks/context-digest"

# Masking consistency check (Bonawitz et al. 2017, round 4 "ConsistencyCheck") -- appended for secure/masking.
SIG_MASKED_CONSISTENCY = b"clinograph/v1/sig/masked-consistency"

# Envelopes with binary attachments (secure/wire.py): the signature covers kind, payload and
# the SHA-256 of every attachment, under its own context so the two frame versions never collide.
SIG_MESSAGE_ATTACHED = b"clinograph/v1/sig/message-attached"

# Exported models (sdk/model/description.py): a hospital signs the description of its exported
# model (architecture, calibration and the SHA-256 of the safetensors weights).
SIG_MODEL_DESCRIPTION = b"clinograph/v1/sig/model-description"

# Ledger high-water marks (sdk/privacy/ledger_file.py): the hospital signs the last ledger state it
# wrote, kept beside the ledger, so that an older (validly signed) ledger is refused.
SIG_LEDGER_HIGHWATER = b"clinograph/v1/sig/ledger-highwater"
SIG_DISTRIBUTED_LEDGER = b"clinograph/v1/sig/distributed-ledger"  # a hospital signs its distributed-DP ledger

# The server's crash journal (secure/runtime/journal.py): each boundary carries an HMAC-SHA256 under a
# key the server derives (HKDF) from its own Ed25519 signing key; the key never leaves the server.
KDF_JOURNAL_MAC = b"clinograph/v1/journal/boundary-mac"

# Threshold CKKS (secure/ckks/threshold.py): the common polynomial a is expanded from
# SHA-256(label, federation, public seed); a decryption request's digest is domain-separated too.
HASH_THRESHOLD_CKKS_COMMON_A = b"clinograph/v1/threshold-ckks/common-a"
HASH_THRESHOLD_CKKS_REQUEST = b"clinograph/v1/threshold-ckks/decryption-request"
#: the combiner's canary in the ckks_threshold mode, expanded from a public seed that key holders check
HASH_THRESHOLD_CKKS_CANARY = b"clinograph/v1/threshold-ckks/canary"
# t-of-N threshold CKKS (secure/ckks/threshold_reshare.py): each holder's Shamir shares of its key
# share are wrapped to the recipient's fresh X25519 key; the same keys give every pair of holders a
# seed (HKDF) whose PRG output masks their decryption shares as a sharing of zero.
KDF_THRESHOLD_CKKS_RESHARE = b"clinograph/v1/threshold-ckks/reshare-wrap"
KDF_THRESHOLD_CKKS_PAIR_SEED = b"clinograph/v1/threshold-ckks/pair-seed"
HASH_THRESHOLD_CKKS_ZERO_SHARE = b"clinograph/v1/threshold-ckks/zero-share"
# commit stage (secure/ckks/threshold_sum.py): the relayed set of signed commitments (each with its
# hospital's fresh nonce); the round's common polynomials a_k are expanded from its digest, and the
# holders' decryption request for the sum is digested under its own label
HASH_THRESHOLD_CKKS_COMMITMENTS = b"clinograph/v1/threshold-ckks/commitment-set"
HASH_THRESHOLD_CKKS_ROUND_A = b"clinograph/v1/threshold-ckks/round-a"
HASH_THRESHOLD_CKKS_SUM_REQUEST = b"clinograph/v1/threshold-ckks/sum-request"
