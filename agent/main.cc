#include <iostream>

#include "agent/cli.h"

int main(int argc, char** argv) {
  return fleetfs::agent::RunCli(argc, argv, std::cout, std::cerr);
}
