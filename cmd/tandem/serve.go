package main

func runServe(args []string) error { return errNotYet }
