"""The application modules beside the command line: what installs things on the machine (the offline data sets
through apt, npm and pip: :mod:`.prepare`) and the ``diffattn data`` command (:mod:`.data_commands`). The library's
data layer (:mod:`diffattn.data`) only reads what these put in the data directory."""
