package raftstore

const mapPopulate = 0
