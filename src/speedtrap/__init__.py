"""speedtrap."""
