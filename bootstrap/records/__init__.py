"""The run's records, which every role writes or reads (docs/contracts.md): status.json and
DONE.json (a node writes DONE.json when the head is lost), each node's phases record, the
attempt's goodput and start-up timeline, the checkpoints' names, and the JSON files a node
keeps. bootstrap/node/, fleet/ and head/ import them from here, below all three."""
