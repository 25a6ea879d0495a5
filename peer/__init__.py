"""The running peer: transport, enrolment and key refresh, the node, the publisher, monitoring."""

from ibe_pubsub.credentials import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "bundle_file": ("file_token",),
    "events_io": ("MAX_BODY", "EventFileError", "EventWriter", "check_body_size", "event_line",
                  "json_value", "parse_event", "read_deliveries", "read_events"),
    "exceptions": ("PeerError",),
    "key_service": ("KeyService", "SingleKeyServer", "ThresholdAccess", "open_service"),
    "known_servers": ("KnownServers", "default_known_servers_path"),
    "monitor": ("HttpAddressError", "parse_http"),
    "node": ("NodeError", "NodeOptions", "PeerNode"),
    "published_ids": (
        "PublishedIds", "PublishedIdsError", "default_published_ids_path", "token_publisher",
    ),
    "publisher": ("EventPublisher", "PublishRefused"),
    "threshold_service": ("ThresholdDeployment",),
    "tls": ("PeerTLS",),
    "transport": ("SOCKET_BUFFER", "Transport", "TransportError"),
    "waiting": ("WaitAnnouncer",),
})
