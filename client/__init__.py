"""The application API: subscribe and publish from Python, asynchronously
(``Subscriber``, ``Publisher``) or blocking (``ibe_pubsub.client.sync``); see docs/api.md."""

from ibe_pubsub.credentials import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "config": ("ThresholdAccess", "load_options", "read_config_file"),
    "events": ("Delivery",),
    "exceptions": (
        "ClientError", "ConfigError", "ConnectError", "ConnectTimeout", "PublishRefused",
        "ReceiveTimeout", "SendFailed", "SubscriberClosed", "SubscriberFailed",
    ),
    "publisher": ("Publisher",),
    "subscriber": ("Subscriber",),
    "sync": ("sync",),
})
