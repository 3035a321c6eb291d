"""The REST API (DRF): adapters that parse, authorize, call one
service and render the selectors' shapes."""
