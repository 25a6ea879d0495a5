"""The overlay protocol as a sans-I/O state machine, and a simulator that drives it."""

from ibe_pubsub.credentials import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "actions": ("Action", "Connected", "Deliver", "Log", "Send", "coalesce", "publication"),
    "checks": ("delivery_errors", "rooted_subscribers", "subscribers_below"),
    "config": ("OverlayConfig", "OverlayConfigError", "Routing"),
    "crypto": ("CostMeter", "RootKit", "SubscriberKit"),
    "crypto_model": ("CostTable", "DEFAULT_COSTS"),
    "crypto_real": ("RealCrypto",),
    "exceptions": ("OverlayError",),
    "kits": ("real_kit",),
    "machine": ("PeerMachine",),
    "simulator": ("DropperKind", "LatencyModel", "Mode", "Simulator", "summary"),
    "snapshot": ("tree_status",),
    "wire": ("MAX_FRAME", "Handover", "Message", "Publish", "Publishes", "SwapHandover",
             "WireError",
             "decode"),
})
