"""Credentials: the event-space schema, credential decompositions and the pairing-based scheme.

A pure library, the lowest layer: it imports nothing else of this project, uses no network
and writes no file (it reads a schema file when asked to load one).
"""

from ibe_pubsub.credentials.faces import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "backends": ("load_group",),
    "ceremony": (
        "BetaState", "BetaStep", "CeremonyError", "beta_step", "check_beta_step",
        "initial_beta_state", "proof_challenge",
    ),
    "certificates": (
        "CertificateError", "ED25519_KEY_BYTES", "RootCertificate", "bundle_message", "fingerprint",
        "peer_ca_message", "peer_link_message", "root_certificate_message", "schema_message",
        "verify_bundle", "verify_peer_ca", "verify_schema",
    ),
    "codec": (
        "CodecError", "codec", "decode_mpk", "decode_msk", "decode_publisher_key",
        "decode_request", "decode_routing_token", "decode_subscriber_key", "encode_mpk",
        "encode_msk", "encode_publisher_key", "encode_request", "encode_routing_token",
        "encode_subscriber_key",
    ),
    "credential": ("Credential", "CredentialFormatError"),
    "decomposition": (
        "covering_credential", "decompose", "enclosing_path", "fine_credentials", "fine_split",
        "root_credential", "virtual_peer_credentials",
    ),
    "dkg": (
        "Complaint", "Dealing", "DkgError", "DkgResult", "Justification", "Participant",
        "qualified_dealers",
    ),
    "exceptions": ("CredentialsError", "DecompositionError"),
    "faces": ("lazy_exports",),
    "groups": ("G1", "G2", "Element", "GroupError", "PairingGroup"),
    "keys": (
        "MasterPublicKey", "MasterSecretKey", "PublisherKey", "RoutingToken", "SCHEME_VERSION",
        "SubscriberKey",
    ),
    "logsafe": ("escape", "log_formatter", "notice", "use_log_format"),
    "messages": ("ConnectionRequest", "RequestOpening", "StreamEvent"),
    "numeric": ("numeric",),
    "peer_certificates": (
        "LINK_SIGNATURE_EXTENSION", "MAX_ADDRESSES", "ROLES", "PeerBinding", "PeerCertificate",
        "PeerCertificateError", "ca_certificate", "ca_key_from_seed", "canonical_address",
        "handshake_ca_certificate", "handshake_ca_key", "is_handshake_ca", "is_unspecified",
        "issue_peer_certificate", "read_peer_certificate", "read_peer_certificate_der", "to_pem",
    ),
    "policy_regions": ("OutsidePolicy", "clause_text", "first_outside"),
    "predicates": (
        "EventFilter", "Predicate", "PredicateError", "check_within", "parse_predicate", "quote",
    ),
    "resharing": ("ReshareDealer", "ReshareRecipient", "ReshareResult"),
    "schema": (
        "Attribute", "BUILTIN_SCHEMAS", "Schema", "SchemaError", "default_schema",
        "resolve_schema",
    ),
    "scheme": (
        "AnyEvent", "Event", "NotAuthorized", "PublicParams", "build_connection_request",
        "keygen_publisher", "keygen_routing_token", "keygen_subscriber", "scheme", "setup",
    ),
    "server_keys": ("Ed25519Server", "ServerVerifier"),
    "streams": ("Stream", "StreamWindow", "streams"),
    "threshold": (
        "ServerSecrets", "ThresholdError", "ThresholdPublicKey", "ThresholdServer", "threshold",
    ),
    "strings": ("strings",),
    "vectors": ("VECTORS_FILE", "build_vectors", "vectors_json"),
})
