"""The REST API of DESIGN §16 (DRF): adapters that parse, authorize, call one
service and render the selectors' shapes."""
