"""Small real agents, one per client library, that the shipped runner profiles are tested with."""
