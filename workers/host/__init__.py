"""Host control: commands, detached engines, signals and the process table, on a host reached
locally or over SSH, every side effect behind the host-side fence."""
