"""The key server: the one trusted party that issues credential keys over HTTP."""

from ibe_pubsub.credentials import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "backups": ("BackupError", "back_up", "check_backup", "postgres_program", "restore"),
    "bundles": (
        "BulkBundle", "BundleError", "IssuedRequest", "PublisherBundle", "ServerParams",
        "SubscriberBundle", "TransportCertificate", "decode_bulk_bundle", "decode_params",
        "decode_publisher_bundle", "decode_root_certificate", "decode_root_token",
        "decode_subscriber_bundle", "decode_transport_certificate",
    ),
    "client": ("KeyServerClient", "KeyServerRequestError"),
    "connections": ("ConnectionLimits",),
    "creation": ("initialise",),
    "db": ("Base",),
    "enrolment": ("plan_subscriber",),
    "epochs": ("DEFAULT_EPOCH_SECONDS", "check_lengths", "default_grace"),
    "exceptions": ("KeyServerError", "ServerSettingsError"),
    "issuer": ("IssuerPool", "issue_subscriber", "issue_subscriber_key"),
    "keystore": (
        "KeyStoreError", "PUBLIC_FILE", "create_keystore", "passphrase_from_env",
        "rotate_admin_token",
    ),
    "sealing": ("UnsealError",),
    "server": ("check_listen_address", "check_tls_files", "serve"),
    "setup_http": ("run_setup",),
    "setup_protocol": (
        "Member", "RefusedMessage", "SetupError", "SetupMember", "SetupPlan", "SetupResult",
        "public_key_fingerprint", "raw_public_key",
    ),
    "state": ("ServerConfig", "check_member_epochs", "initialised_epochs"),
    "threshold_admin": (
        "MemberOutcome", "check_members", "register_at_members", "revoke_at_members",
        "write_access_file",
    ),
    "threshold_client": (
        "CombinedLinkCertificate", "CombinedPublisherKeys", "CombinedRoot",
        "CombinedSubscriberKey", "Failure", "MemberAccess", "TakenAt", "ThresholdEnrolmentError",
        "ThresholdKeyClient", "MAX_ANSWER_BYTES", "UNREACHABLE", "max_answer_bytes",
        "read_access_file",
    ),
    "threshold_store": (
        "MEMBER_KEY_FILE", "SHARES_FILE", "THRESHOLD_PUBLIC_FILE", "ThresholdMember",
        "ThresholdStoreError", "create_member_key", "load_member", "load_member_key",
        "load_shares", "member_key_text",
        "parse_members", "read_public_document", "save_setup",
    ),
})
