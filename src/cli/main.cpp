#include <cstdio>
int main() { std::puts("selfserve: under construction"); return 0; }
