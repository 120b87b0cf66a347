"""monsoon's unit tests: pure logic, fakes allowed, no live service."""
