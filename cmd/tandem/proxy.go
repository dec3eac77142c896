package main

func runProxy(args []string) error { return errNotYet }
