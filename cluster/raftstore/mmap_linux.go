package raftstore

import "syscall"

const mapPopulate = syscall.MAP_POPULATE
