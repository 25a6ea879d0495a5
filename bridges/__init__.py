"""Bridges between the overlay and the brokers people already run (MQTT, NATS): messages of a
local topic published into the overlay, and a subscriber's events delivered to a local
topic; see docs/bridges.md. The broker clients come with the ``bridges`` extra."""

from ibe_pubsub.credentials import lazy_exports

__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "bridge": ("InBridge", "OutBridge"),
    "exceptions": ("BridgeError", "BrokerLost", "ClientLibraryMissing", "MessageRefused"),
    "link": ("Backoff", "BoundedQueue", "Broker", "Counters", "Session"),
    "mapping": ("TopicTemplate", "delivery_payload", "message_event"),
    "mqtt": ("MqttBroker",),
    "nats": ("NatsBroker",),
})
